package interceptor_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/transport"
)

// TestClientSendsTheRequestFieldKey: a call whose request carries its key in
// request_id, the field marked (idem.v1.field).key (AIP-155), goes through
// idem's client interceptor with that key and no other, also inside a keyed
// handler and with a key set by ContextWithKey; every attempt of the retry
// interceptor below it carries it, and the side effect happens once.
func TestClientSendsTheRequestFieldKey(t *testing.T) {
	pool := newEffectsPool(t)
	svc := &testService{pool: pool}
	var (
		mu   sync.Mutex
		seen []string // the key each execution ran under
	)
	failed := map[string]bool{}
	svc.setHook(func(ctx context.Context, value string) error {
		key, _ := idem.KeyFromContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, key)
		if !failed[value] { // each request's first attempt fails transiently
			failed[value] = true
			return status.Error(codes.Unavailable, "flaky")
		}
		return nil
	})
	rec, addr := serve(t, pool, svc)
	client := dial(t, addr, grpc.WithChainUnaryInterceptor(
		interceptor.UnaryClientInterceptor(),
		retry.UnaryClientInterceptor(
			retry.WithMax(3),
			retry.WithCodes(codes.Unavailable),
			retry.WithBackoff(retry.BackoffLinear(10*time.Millisecond))),
	))
	ctx := deadline(t, 30*time.Second)

	for _, c := range []struct {
		name string
		ctx  context.Context
		key  string
	}{
		{"outside a handler", ctx, "req-1"},
		{"with ContextWithKey", idem.ContextWithKey(ctx, "elsewhere"), "req-2"},
		// In a keyed handler, where a plain call would get a child key.
		{"inside a keyed handler", keyedHandlerContext(t, "parent"), "req-3"},
	} {
		before := len(rec.of(methodDo))
		mu.Lock()
		seenBefore := len(seen)
		mu.Unlock()
		if _, err := client.Do(c.ctx, &testv1.DoRequest{Value: c.name, RequestId: c.key}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		as := rec.of(methodDo)[before:]
		if len(as) != 2 {
			t.Fatalf("%s: the server saw %d attempts, want 2", c.name, len(as))
		}
		for i, a := range as {
			if len(a.keys) != 0 && !slices.Equal(a.keys, []string{c.key}) {
				t.Errorf("%s: attempt %d carried metadata keys %q besides request_id %q", c.name, i+1, a.keys, c.key)
			}
		}
		mu.Lock()
		got := slices.Clone(seen[seenBefore:])
		mu.Unlock()
		if !slices.Equal(got, []string{c.key, c.key}) {
			t.Errorf("%s: executions ran under keys %q, want %q twice", c.name, got, c.key)
		}
		if n := countEffects(t, pool, c.key); n != 1 {
			t.Errorf("%s: %d effects under %s, want 1", c.name, n, c.key)
		}
	}
	// The retried call is replayed under the field's key.
	if _, err := client.Do(ctx, &testv1.DoRequest{Value: "outside a handler", RequestId: "req-1"}); err != nil {
		t.Fatal(err)
	}
	if n := countEffects(t, pool, "req-1"); n != 1 {
		t.Errorf("%d effects under req-1 after a second logical call, want 1", n)
	}
}

// keyedHandlerContext returns the context of a keyed handler, whose calls
// through the client interceptor get child keys: the context a server
// interceptor hands a handler of Do under key.
func keyedHandlerContext(t *testing.T, key string) context.Context {
	t.Helper()
	e := idemtest.NewEngine(t, memory.New())
	got := make(chan context.Context, 1)
	call := transport.Call{Method: methodDo, Keys: []string{key}, Request: &testv1.DoRequest{Value: "parent"}}
	_, err := transport.Handle(t.Context(), e, call, func(ctx context.Context) (transport.Reply, error) {
		got <- ctx
		return transport.Reply{Message: &testv1.DoResponse{}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return <-got
}

// TestRequestFieldAndMetadataKeysDiffer: a call whose request_id and
// metadata carry different keys is refused with a message that names both
// sources, not as an invalid header.
func TestRequestFieldAndMetadataKeysDiffer(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		_, err := e.client.Do(withKey("other"), &testv1.DoRequest{Value: "v", RequestId: "req-1"})
		st := wantCode(t, err, codes.InvalidArgument)
		msg := st.Message()
		if strings.Contains(msg, "invalid "+idem.KeyHeader+" header") ||
			!strings.Contains(msg, "request_id") || !strings.Contains(msg, idem.KeyHeader) {
			t.Errorf("message %q: want one that names request_id and %s, not an invalid header", msg, idem.KeyHeader)
		}
		var fields []string
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok {
				for _, v := range br.GetFieldViolations() {
					fields = append(fields, v.GetField())
				}
			}
		}
		slices.Sort(fields)
		if want := []string{idem.KeyHeader, "request_id"}; !slices.Equal(fields, want) {
			t.Errorf("field violations on %q, want %q", fields, want)
		}
		if n := e.svc.count(); n != 0 {
			t.Errorf("%d executions, want none", n)
		}
	})
}

// TestClientFillsTheRequestField: a call of a keyed method whose request_id
// is empty gets a new key in request_id as well as in the metadata (as
// AIP-4235 has client libraries fill it), on a copy of the request. grpc-go's
// own retries (a retryPolicy in the service config) resend that copy: the
// server sees the same key in both places on both attempts, and the
// handler runs once. The caller's message is left empty, so sending it again
// is another logical call, with a key of its own.
func TestClientFillsTheRequestField(t *testing.T) {
	pool := newEffectsPool(t)
	svc := &testService{pool: pool}
	rec, addr := serve(t, pool, svc)
	// Each call's first attempt is lost before idem sees it.
	rec.setRefuse(func(n int) error {
		if n%2 == 1 {
			return status.Error(codes.Unavailable, "connection reset")
		}
		return nil
	})
	client := dial(t, addr,
		grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()),
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{
			"name": [{"service": "idem.test.v1.TestService"}],
			"retryPolicy": {
				"maxAttempts": 2,
				"initialBackoff": "0.01s",
				"maxBackoff": "0.01s",
				"backoffMultiplier": 1,
				"retryableStatusCodes": ["UNAVAILABLE"]
			}
		}]}`))
	ctx := deadline(t, 30*time.Second)

	req := &testv1.DoRequest{Value: "v"}
	var keys []string
	for call := 1; call <= 2; call++ {
		if _, err := client.Do(ctx, req); err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		if req.GetRequestId() != "" {
			t.Fatalf("call %d: the caller's request now has request_id %q, want it left empty", call, req.GetRequestId())
		}
		as := rec.of(methodDo)
		if len(as) != 2*call {
			t.Fatalf("call %d: the server saw %d attempts in all, want %d", call, len(as), 2*call)
		}
		first, second := as[2*call-2], as[2*call-1]
		key := onlyKey(t, first)
		if u, err := uuid.Parse(key); err != nil || u.Version() != 7 {
			t.Errorf("call %d: key %q is not a UUIDv7", call, key)
		}
		for i, a := range []attempt{first, second} {
			if k := onlyKey(t, a); k != key || a.field != key {
				t.Errorf("call %d, attempt %d: metadata key %q and request_id %q, want %q in both", call, i+1, k, a.field, key)
			}
		}
		if first.code != codes.Unavailable || second.code != codes.OK {
			t.Errorf("call %d: attempts answered %v and %v, want UNAVAILABLE and OK", call, first.code, second.code)
		}
		if n := countEffects(t, pool, key); n != 1 {
			t.Errorf("call %d: %d effects under %s, want 1", call, n, key)
		}
		keys = append(keys, key)
	}
	if keys[0] == keys[1] {
		t.Errorf("two logical calls with one message shared the key %s", keys[0])
	}
	if n := svc.count(); n != 2 {
		t.Errorf("the handler ran %d times, want once per logical call (2)", n)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = ANY($1) AND status = 'recorded'`, keys).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2 {
		t.Errorf("%d completed key rows for %q, want 2", rows, keys)
	}
}

// TestClientFillsTheRequestFieldWithTheCallersKey: a key set with
// ContextWithKey goes in the empty request_id too; a key the caller put in
// the metadata goes as it is, and request_id stays empty.
func TestClientFillsTheRequestFieldWithTheCallersKey(t *testing.T) {
	pool := newEffectsPool(t)
	svc := &testService{pool: pool}
	rec, addr := serve(t, pool, svc)
	client := dial(t, addr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()))
	ctx := deadline(t, 30*time.Second)

	for _, c := range []struct {
		name      string
		ctx       context.Context
		key       string
		wantField string
	}{
		{"ContextWithKey", idem.ContextWithKey(ctx, "chosen"), "chosen", "chosen"},
		{"metadata", metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, "own"), "own", ""},
	} {
		if _, err := client.Do(c.ctx, &testv1.DoRequest{Value: c.name}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		as := rec.of(methodDo)
		a := as[len(as)-1]
		if k := onlyKey(t, a); k != c.key || a.field != c.wantField {
			t.Errorf("%s: metadata key %q and request_id %q, want %q and %q", c.name, k, a.field, c.key, c.wantField)
		}
		if n := countEffects(t, pool, c.key); n != 1 {
			t.Errorf("%s: %d effects under %s, want 1", c.name, n, c.key)
		}
	}
}

// forwarder is an upstream TestService whose Do sends the request it was
// sent on to the downstream service, request_id and all.
type forwarder struct {
	testv1.UnimplementedTestServiceServer
	down testv1.TestServiceClient
}

func (f *forwarder) Do(ctx context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	resp, err := f.down.Do(ctx, req)
	if err != nil {
		return nil, err
	}
	if req.GetRequestId() == "" {
		return nil, status.Error(codes.Internal, "the handler's request lost its request_id")
	}
	return resp, nil
}

// TestClientNeverForwardsTheRequestFieldKey: a keyed handler that sends on
// the request it was sent, whose request_id holds its own key, sends the
// child key instead, in the metadata and in request_id, and its request
// keeps its key.
func TestClientNeverForwardsTheRequestFieldKey(t *testing.T) {
	downPool, upPool := newEffectsPool(t), newEffectsPool(t)
	down := &testService{pool: downPool}
	downRec, downAddr := serve(t, downPool, down)
	up := &forwarder{down: dial(t, downAddr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()))}
	_, upAddr := serve(t, upPool, up)
	client := dial(t, upAddr)
	ctx := deadline(t, 30*time.Second)

	const parent = "parent-key"
	for range 2 { // the second call is replayed upstream
		if _, err := client.Do(ctx, &testv1.DoRequest{Value: "v", RequestId: parent}); err != nil {
			t.Fatal(err)
		}
	}
	child := idemtest.CallKey(store.Scope{Method: methodDo, Key: parent}, methodDo, 1)
	as := downRec.of(methodDo)
	if len(as) != 1 {
		t.Fatalf("downstream saw %d calls, want 1", len(as))
	}
	if k := onlyKey(t, as[0]); k != child || as[0].field != child {
		t.Errorf("downstream call carried metadata key %q and request_id %q, want the child key %q in both", k, as[0].field, child)
	}
	if n := countEffects(t, downPool, child); n != 1 || down.count() != 1 {
		t.Errorf("%d downstream effects under the child key and %d executions, want 1 and 1", n, down.count())
	}
}
