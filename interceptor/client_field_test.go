package interceptor_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
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
	e := newEngine(t, memory.New())
	got := make(chan context.Context, 1)
	call := idem.Call{Method: methodDo, Keys: []string{key}, Request: &testv1.DoRequest{Value: "parent"}}
	_, err := e.Handle(t.Context(), call, func(ctx context.Context) (idem.Reply, error) {
		got <- ctx
		return idem.Reply{Message: &testv1.DoResponse{}}, nil
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
