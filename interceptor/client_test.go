package interceptor_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

const (
	methodDo    = "/idem.test.v1.TestService/Do"
	methodMaybe = "/idem.test.v1.TestService/Maybe"
	methodRead  = "/idem.test.v1.TestService/Read"
)

// attempt is one call as the server saw it, before idem.
type attempt struct {
	method string
	keys   []string // values of idempotency-key
	field  string   // request_id of a DoRequest
	code   codes.Code
	start  time.Time
	end    time.Time
}

// recorder is a server interceptor, placed first in the chain, that records
// every call that reaches the server.
type recorder struct {
	mu       sync.Mutex
	attempts []attempt
	// refuse, when set, is asked about the n-th call (from 1) to reach
	// the server; an error it returns is the call's answer, and the call
	// goes no further.
	refuse  func(n int) error
	arrived int
}

func (r *recorder) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	a := attempt{method: info.FullMethod, keys: metadata.ValueFromIncomingContext(ctx, idem.KeyHeader), start: time.Now()}
	if d, ok := req.(*testv1.DoRequest); ok {
		a.field = d.GetRequestId()
	}
	r.mu.Lock()
	r.arrived++
	refuse, n := r.refuse, r.arrived
	r.mu.Unlock()
	var err error
	if refuse != nil {
		err = refuse(n)
	}
	var resp any
	if err == nil {
		resp, err = handler(ctx, req)
	}
	a.code, a.end = status.Code(err), time.Now()
	r.mu.Lock()
	r.attempts = append(r.attempts, a)
	r.mu.Unlock()
	return resp, err
}

// setRefuse sets r.refuse.
func (r *recorder) setRefuse(refuse func(n int) error) {
	r.mu.Lock()
	r.refuse = refuse
	r.mu.Unlock()
}

func (r *recorder) all() []attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.attempts)
}

// of returns the recorded attempts of method.
func (r *recorder) of(method string) []attempt {
	var out []attempt
	for _, a := range r.all() {
		if a.method == method {
			out = append(out, a)
		}
	}
	return out
}

// newEffectsPool returns a pool on a fresh migrated database with the
// effects table of testService.
// warmPool opens n connections of pool and returns them to it idle.
func warmPool(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

func newEffectsPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (id bigserial PRIMARY KEY, key text, value text)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// serve starts srv with impl behind a recorder and idem's server
// interceptor on pool, and returns the recorder and the address.
func serve(t *testing.T, pool *pgxpool.Pool, impl testv1.TestServiceServer, opts ...idem.Option) (*recorder, string) {
	t.Helper()
	return serveWith(t, pool, impl, nil, opts...)
}

func serveWith(t *testing.T, pool *pgxpool.Pool, impl testv1.TestServiceServer, storeOpts []postgres.Option, opts ...idem.Option) (*recorder, string) {
	t.Helper()
	rec := &recorder{}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		rec.unary,
		recovery.UnaryServerInterceptor(),
		interceptor.UnaryServerInterceptor(idemtest.NewEngine(t, postgres.New(pool, storeOpts...), opts...)),
	))
	testv1.RegisterTestServiceServer(srv, impl)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return rec, lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) testv1.TestServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return testv1.NewTestServiceClient(conn)
}

func countEffects(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// onlyKey returns the single key of a, failing the test otherwise.
func onlyKey(t *testing.T, a attempt) string {
	t.Helper()
	if len(a.keys) != 1 {
		t.Fatalf("%s carried keys %q, want exactly one", a.method, a.keys)
	}
	return a.keys[0]
}

func TestClientKeysMethodsThatRequireOne(t *testing.T) {
	pool := newEffectsPool(t)
	rec, addr := serve(t, pool, &testService{pool: pool})
	client := dial(t, addr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()))
	ctx := deadline(t, 30*time.Second)

	for _, v := range []string{"one", "two"} {
		if _, err := client.Do(ctx, &testv1.DoRequest{Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Maybe(ctx, &testv1.MaybeRequest{Value: "optional"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Read(ctx, &testv1.ReadRequest{Value: "read"}); err != nil {
		t.Fatal(err)
	}

	dos := rec.of(methodDo)
	if len(dos) != 2 {
		t.Fatalf("server saw %d calls of Do, want 2", len(dos))
	}
	k1, k2 := onlyKey(t, dos[0]), onlyKey(t, dos[1])
	if k1 == k2 {
		t.Fatalf("two logical calls shared the key %s", k1)
	}
	for _, k := range []string{k1, k2} {
		u, err := uuid.Parse(k)
		if err != nil || u.Version() != 7 {
			t.Errorf("generated key %q is not a version 7 UUID (err %v)", k, err)
		}
		if n := countEffects(t, pool, k); n != 1 {
			t.Errorf("%d effects under generated key %s, want 1", n, k)
		}
	}
	for _, m := range []string{methodMaybe, methodRead} {
		for _, a := range rec.of(m) {
			if len(a.keys) != 0 {
				t.Errorf("%s got keys %q, want none", m, a.keys)
			}
		}
	}
}

func TestClientWithKeyedMethods(t *testing.T) {
	pool := newEffectsPool(t)
	rec, addr := serve(t, pool, &testService{pool: pool})
	everything := func(context.Context, string) bool { return true }
	client := dial(t, addr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor(idem.WithKeyedMethods(everything))))
	ctx := deadline(t, 30*time.Second)

	if _, err := client.Maybe(ctx, &testv1.MaybeRequest{Value: "selected"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Read(ctx, &testv1.ReadRequest{Value: "read"}); err != nil {
		t.Fatal(err)
	}
	key := onlyKey(t, rec.of(methodMaybe)[0])
	if n := countEffects(t, pool, key); n != 1 {
		t.Errorf("%d effects under %s, want 1", n, key)
	}
	if keys := rec.of(methodRead)[0].keys; len(keys) != 0 {
		t.Errorf("NO_SIDE_EFFECTS method got keys %q although the matcher selected it", keys)
	}
}

func TestClientKeepsTheCallersKey(t *testing.T) {
	pool := newEffectsPool(t)
	svc := &testService{pool: pool}
	rec, addr := serve(t, pool, svc)
	client := dial(t, addr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()))
	ctx := deadline(t, 30*time.Second)

	if _, err := client.Do(idem.ContextWithKey(ctx, "order-1"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	md := metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, "order-2")
	if _, err := client.Do(md, &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	// ContextWithKey wins over metadata, and applies to optional-key methods.
	if _, err := client.Maybe(idem.ContextWithKey(md, "order-3"), &testv1.MaybeRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	got := []string{onlyKey(t, rec.of(methodDo)[0]), onlyKey(t, rec.of(methodDo)[1]), onlyKey(t, rec.of(methodMaybe)[0])}
	if want := []string{"order-1", "order-2", "order-3"}; !slices.Equal(got, want) {
		t.Fatalf("server saw keys %q, want %q", got, want)
	}
	for _, k := range got {
		if n := countEffects(t, pool, k); n != 1 {
			t.Errorf("%d effects under %s, want 1", n, k)
		}
	}

	before := len(rec.all())
	_, err := client.Do(idem.ContextWithKey(ctx, "has space"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.InvalidArgument)
	if after := len(rec.all()); after != before {
		t.Fatalf("a call with an invalid key reached the server")
	}
}

// TestClientKeyIsStableAcrossMiddlewareRetries: with go-grpc-middleware's
// retry interceptor inside idem's, every attempt carries the key idem
// attached once, and the side effect happens once.
func TestClientKeyIsStableAcrossMiddlewareRetries(t *testing.T) {
	pool := newEffectsPool(t)
	svc := &testService{pool: pool}
	failures := 2
	svc.setHook(func(context.Context, string) error {
		if failures > 0 {
			failures--
			return status.Error(codes.Unavailable, "flaky")
		}
		return nil
	})
	rec, addr := serve(t, pool, svc)
	client := dial(t, addr, grpc.WithChainUnaryInterceptor(
		interceptor.UnaryClientInterceptor(),
		retry.UnaryClientInterceptor(
			retry.WithMax(5),
			retry.WithCodes(codes.Unavailable, codes.Aborted),
			retry.WithBackoff(retry.BackoffLinear(10*time.Millisecond))),
	))
	if _, err := client.Do(deadline(t, 30*time.Second), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	assertOneKeyManyAttempts(t, rec, pool, svc, 3)
}

// TestClientKeyIsStableAcrossServiceConfigRetries: grpc-go's own retries,
// configured in the service config, resend the same metadata.
func TestClientKeyIsStableAcrossServiceConfigRetries(t *testing.T) {
	pool := newEffectsPool(t)
	svc := &testService{pool: pool}
	fail := []codes.Code{codes.Aborted, codes.Unavailable}
	svc.setHook(func(context.Context, string) error {
		if len(fail) > 0 {
			c := fail[0]
			fail = fail[1:]
			return status.Error(c, "try again")
		}
		return nil
	})
	rec, addr := serve(t, pool, svc)
	client := dial(t, addr,
		grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()),
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{
			"name": [{"service": "idem.test.v1.TestService"}],
			"retryPolicy": {
				"maxAttempts": 4,
				"initialBackoff": "0.01s",
				"maxBackoff": "0.1s",
				"backoffMultiplier": 2,
				"retryableStatusCodes": ["ABORTED", "UNAVAILABLE"]
			}
		}]}`))
	if _, err := client.Do(deadline(t, 30*time.Second), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	assertOneKeyManyAttempts(t, rec, pool, svc, 3)
}

func assertOneKeyManyAttempts(t *testing.T, rec *recorder, pool *pgxpool.Pool, svc *testService, n int) {
	t.Helper()
	as := rec.of(methodDo)
	if len(as) != n {
		t.Fatalf("server saw %d attempts, want %d", len(as), n)
	}
	key := onlyKey(t, as[0])
	for i, a := range as {
		if k := onlyKey(t, a); k != key {
			t.Fatalf("attempt %d carried key %s, attempt 0 carried %s", i, k, key)
		}
		// The request's empty request_id was filled with the same key.
		if a.field != key {
			t.Errorf("attempt %d carried request_id %q, want the key %s", i, a.field, key)
		}
	}
	if got := svc.count(); got != int64(n) {
		t.Errorf("handler ran %d times, want %d", got, n)
	}
	// The failed attempts were transient, so their writes rolled back.
	if c := countEffects(t, pool, key); c != 1 {
		t.Errorf("%d effects under %s, want 1", c, key)
	}
}

// TestBackoffRetryInfo: a duplicate that finds the key in use is answered
// ABORTED with RetryInfo; the retry interceptor, with BackoffRetryInfo,
// waits the suggested delay instead of its own short backoff, and the
// retry then gets the first call's recorded response.
func TestBackoffRetryInfo(t *testing.T) {
	const suggested = 400 * time.Millisecond
	pool := newEffectsPool(t)
	svc := &testService{pool: pool}
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	svc.setHook(func(context.Context, string) error {
		once.Do(func() {
			close(started)
			<-release
		})
		return nil
	})
	// The lock timeout also bounds the wait for a pool connection: open
	// the connections the two calls need beforehand, so that on a busy
	// machine the duplicate waits for the key, not for a connection.
	warmPool(t, pool, 4)
	rec, addr := serveWith(t, pool, svc,
		[]postgres.Option{postgres.WithLockTimeout(50 * time.Millisecond)},
		idem.WithRetryDelay(suggested))
	client := dial(t, addr, grpc.WithChainUnaryInterceptor(
		interceptor.UnaryClientInterceptor(),
		retry.UnaryClientInterceptor(
			retry.WithMax(5),
			retry.WithCodes(codes.Aborted),
			retry.WithBackoff(interceptor.BackoffRetryInfo(retry.BackoffLinear(time.Millisecond)))),
	))
	ctx := idem.ContextWithKey(deadline(t, 30*time.Second), "in-use")

	first := make(chan error, 1)
	go func() {
		_, err := client.Do(ctx, &testv1.DoRequest{Value: "v"})
		first <- err
	}()
	<-started
	// The duplicate's first attempt waits out the lock timeout and is told
	// to come back later; only then does the first call finish.
	second := make(chan error, 1)
	var header metadata.MD
	go func() {
		_, err := client.Do(ctx, &testv1.DoRequest{Value: "v"}, grpc.Header(&header))
		second <- err
	}()
	for !slices.ContainsFunc(rec.of(methodDo), func(a attempt) bool { return a.code == codes.Aborted }) {
		select {
		case err := <-second:
			t.Fatalf("the duplicate ended without an ABORTED attempt: %v; attempts %+v", err, rec.of(methodDo))
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}

	as := rec.of(methodDo)
	var aborted, retried *attempt
	for i := range as {
		if as[i].code == codes.Aborted && aborted == nil {
			aborted = &as[i]
		} else if aborted != nil && as[i].start.After(aborted.end) && retried == nil {
			retried = &as[i]
		}
	}
	if aborted == nil || retried == nil {
		t.Fatalf("attempts %+v: want an ABORTED attempt and a retry after it", as)
	}
	if gap := retried.start.Sub(aborted.end); gap < suggested {
		t.Errorf("retry came %v after ABORTED, before the suggested %v", gap, suggested)
	}
	if len(header.Get(idem.ReplayedHeader)) == 0 {
		t.Error("the duplicate's final answer was not a replay")
	}
	if n := countEffects(t, pool, "in-use"); n != 1 || svc.count() != 1 {
		t.Errorf("%d effects and %d executions, want 1 and 1", n, svc.count())
	}
}

func TestBackoffRetryInfoFallsBack(t *testing.T) {
	backoff := interceptor.BackoffRetryInfo(func(context.Context, uint) time.Duration { return 7 * time.Millisecond })
	// Outside the idem client interceptor there is nothing to read.
	if d := backoff(context.Background(), 1); d != 7*time.Millisecond {
		t.Fatalf("backoff = %v, want the fallback's 7ms", d)
	}
	if d := interceptor.BackoffRetryInfo(nil)(context.Background(), 1); d != 0 {
		t.Fatalf("backoff without fallback = %v, want 0", d)
	}
}

func TestRetryDelay(t *testing.T) {
	st, err := status.New(codes.Aborted, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := interceptor.RetryDelay(st.Err()); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryDelay = %v, %v; want 1.5s, true", d, ok)
	}
	for _, err := range []error{nil, errors.New("plain"), status.Error(codes.Aborted, "no details")} {
		if d, ok := interceptor.RetryDelay(err); ok {
			t.Errorf("RetryDelay(%v) = %v, true; want false", err, d)
		}
	}
}

// relay is an upstream TestService whose Do calls the downstream service:
// Do twice, Do with the child key of a step it names, Do with the parent key copied into the
// outgoing metadata, then Maybe and Read, which take no key. Its first
// execution then fails transiently, so the retried request repeats every
// call.
type relay struct {
	testv1.UnimplementedTestServiceServer
	down testv1.TestServiceClient

	mu   sync.Mutex
	runs int
}

func (r *relay) Do(ctx context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	parent, _ := idem.KeyFromContext(ctx)
	calls := []func() error{
		func() error { _, err := r.down.Do(ctx, &testv1.DoRequest{Value: "first"}); return err },
		func() error { _, err := r.down.Do(ctx, &testv1.DoRequest{Value: "second"}); return err },
		func() error {
			named, _ := idem.ChildKey(ctx, "named")
			_, err := r.down.Do(idem.ContextWithKey(ctx, named), &testv1.DoRequest{Value: "named"})
			return err
		},
		func() error {
			fwd := metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, parent)
			_, err := r.down.Do(fwd, &testv1.DoRequest{Value: "forwarded"})
			return err
		},
		func() error { _, err := r.down.Maybe(ctx, &testv1.MaybeRequest{Value: "maybe"}); return err },
		func() error { _, err := r.down.Read(ctx, &testv1.ReadRequest{Value: "read"}); return err },
	}
	for _, call := range calls {
		if err := call(); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	r.runs++
	first := r.runs == 1
	r.mu.Unlock()
	if first {
		return nil, status.Error(codes.Unavailable, "crashed after the calls")
	}
	return &testv1.DoResponse{Value: req.GetValue()}, nil
}

// TestClientDerivesChildKeys: a keyed handler's calls get keys idemtest.Derived from
// its request's, whether that key came in the metadata or in the request's
// request_id, the same on every execution; each downstream call carries its
// child key in its metadata and in its own request_id.
func TestClientDerivesChildKeys(t *testing.T) {
	for _, via := range []string{"metadata", "request_id"} {
		t.Run(via, func(t *testing.T) { testClientDerivesChildKeys(t, via) })
	}
}

func testClientDerivesChildKeys(t *testing.T, via string) {
	downPool, upPool := newEffectsPool(t), newEffectsPool(t)
	down := &testService{pool: downPool}
	downRec, downAddr := serve(t, downPool, down)
	up := &relay{down: dial(t, downAddr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()))}
	upRec, upAddr := serve(t, upPool, up)
	client := dial(t, upAddr)
	ctx := deadline(t, 30*time.Second)

	const parent = "parent-key"
	req := &testv1.DoRequest{Value: "order"}
	if via == "metadata" {
		ctx = metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, parent)
	} else {
		req.RequestId = parent
	}
	_, err := client.Do(ctx, req)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("first execution: %v, want UNAVAILABLE", err)
	}
	if _, err := client.Do(ctx, req); err != nil {
		t.Fatalf("retry: %v", err)
	}
	for _, a := range upRec.of(methodDo) {
		if got := len(a.keys); (got == 0) != (via == "request_id") {
			t.Fatalf("the upstream call carried metadata keys %q with its key in %s", a.keys, via)
		}
	}

	scope := store.Scope{Method: methodDo, Key: parent}
	want := []string{
		idemtest.CallKey(scope, methodDo, 1),
		idemtest.CallKey(scope, methodDo, 2),
		idemtest.StepKey(scope, "named"),
		idemtest.CallKey(scope, methodDo, 3),
	}
	var got, fields []string
	for _, a := range downRec.of(methodDo) {
		got = append(got, onlyKey(t, a))
		fields = append(fields, a.field)
	}
	wantBoth := append(slices.Clone(want), want...)
	if !slices.Equal(got, wantBoth) {
		t.Fatalf("downstream saw keys\n%q\nwant the idemtest.Derived sequence twice\n%q", got, wantBoth)
	}
	if !slices.Equal(fields, wantBoth) {
		t.Errorf("downstream requests carried request_id\n%q\nwant their child keys\n%q", fields, wantBoth)
	}
	for _, m := range []string{methodMaybe, methodRead} {
		for _, a := range downRec.of(m) {
			if len(a.keys) != 0 {
				t.Errorf("%s got keys %q, want none", m, a.keys)
			}
		}
	}
	// One downstream effect per child key: the retried parent's calls were
	// replays. Maybe and Read ran on both executions.
	for _, k := range want {
		if n := countEffects(t, downPool, k); n != 1 {
			t.Errorf("%d downstream effects under %s, want 1", n, k)
		}
	}
	if n := down.count(); n != 4+2*2 {
		t.Errorf("downstream handlers ran %d times, want 8 (4 keyed once, Maybe and Read twice)", n)
	}
}

// tenantHeader is the metadata key the upstream test servers read their
// tenant from.
const tenantHeader = "x-tenant-id"

func headerTenant(_ context.Context, header map[string][]string) (string, error) {
	if v := header[tenantHeader]; len(v) == 1 {
		return v[0], nil
	}
	return "", nil
}

// fanout is an upstream TestService whose Do and Maybe both make the same
// two downstream calls of Do, numbered and under the step "charge", and
// answer with the execution number of the numbered one; it keeps the
// ChildKey of "charge" it saw. Each tenant's first execution of each method
// then fails transiently, so that the retried request repeats the calls.
type fanout struct {
	testv1.UnimplementedTestServiceServer
	down testv1.TestServiceClient

	mu       sync.Mutex
	runs     map[string]int    // by tenant and method
	children map[string]string // ChildKey(ctx, "charge") by tenant and method
}

func (f *fanout) call(ctx context.Context, value string) (int64, error) {
	resp, err := f.down.Do(ctx, &testv1.DoRequest{Value: value})
	if err != nil {
		return 0, err
	}
	charge, _ := idem.ChildKey(ctx, "charge")
	if _, err := f.down.Do(idem.ContextWithKey(ctx, charge), &testv1.DoRequest{Value: value + "/charge"}); err != nil {
		return 0, err
	}
	method, _ := grpc.Method(ctx)
	md, _ := metadata.FromIncomingContext(ctx)
	tenant, _ := headerTenant(ctx, md)
	child, _ := idem.ChildKey(ctx, "charge")
	f.mu.Lock()
	if f.runs == nil {
		f.runs, f.children = map[string]int{}, map[string]string{}
	}
	f.children[tenant+" "+method] = child
	f.runs[tenant+" "+method]++
	first := f.runs[tenant+" "+method] == 1
	f.mu.Unlock()
	if first {
		return 0, status.Error(codes.Unavailable, "crashed after the calls")
	}
	return resp.GetExecution(), nil
}

// child returns the ChildKey of "charge" that the request of tenant and
// method saw.
func (f *fanout) child(tenant, method string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.children[tenant+" "+method]
}

func (f *fanout) Do(ctx context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	n, err := f.call(ctx, req.GetValue())
	if err != nil {
		return nil, err
	}
	return &testv1.DoResponse{Value: req.GetValue(), Execution: n}, nil
}

func (f *fanout) Maybe(ctx context.Context, req *testv1.MaybeRequest) (*testv1.MaybeResponse, error) {
	n, err := f.call(ctx, req.GetValue())
	if err != nil {
		return nil, err
	}
	return &testv1.MaybeResponse{Value: req.GetValue(), Execution: n}, nil
}

// TestClientChildKeysAreScopedByTenantAndMethod: the same key sent to two
// methods of an upstream service by two tenants names four operations, so
// the downstream service, which the upstream calls under one identity of
// its own, sees four distinct child keys per step and acts four times; a
// retried parent repeats its own children exactly.
func TestClientChildKeysAreScopedByTenantAndMethod(t *testing.T) {
	downPool, upPool := newEffectsPool(t), newEffectsPool(t)
	down := &testService{pool: downPool}
	downRec, downAddr := serve(t, downPool, down)
	up := &fanout{down: dial(t, downAddr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()))}
	_, upAddr := serve(t, upPool, up, idem.WithTenant(headerTenant))
	client := dial(t, upAddr)

	const parent = "order-1"
	type operation struct{ tenant, method string }
	var ops []operation
	answers := map[int64]operation{}
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		for _, method := range []string{methodDo, methodMaybe} {
			op := operation{tenant, method}
			ops = append(ops, op)
			ctx := metadata.AppendToOutgoingContext(deadline(t, 30*time.Second),
				idem.KeyHeader, parent, tenantHeader, tenant)
			call := func() (int64, error) {
				if method == methodDo {
					resp, err := client.Do(ctx, &testv1.DoRequest{Value: "charge 10 EUR"})
					return resp.GetExecution(), err
				}
				resp, err := client.Maybe(ctx, &testv1.MaybeRequest{Value: "charge 10 EUR"})
				return resp.GetExecution(), err
			}
			if _, err := call(); status.Code(err) != codes.Unavailable {
				t.Fatalf("%v, first execution: %v, want UNAVAILABLE", op, err)
			}
			n, err := call()
			if err != nil {
				t.Fatalf("%v, retry: %v", op, err)
			}
			if other, ok := answers[n]; ok {
				t.Errorf("%v got the answer of %v (downstream execution %d)", op, other, n)
			}
			answers[n] = op
		}
	}

	// Each operation made two calls, and its retry repeated them with the
	// same keys: 16 attempts under 8 keys.
	as := downRec.of(methodDo)
	if len(as) != 4*2*2 {
		t.Fatalf("downstream saw %d calls of Do, want 16", len(as))
	}
	seen := map[string]bool{}
	for i, op := range ops {
		scope := store.Scope{Tenant: op.tenant, Method: op.method, Key: parent}
		want := []string{idemtest.CallKey(scope, methodDo, 1), idemtest.StepKey(scope, "charge")}
		if got := up.child(op.tenant, op.method); got != want[1] {
			t.Errorf("%v: ChildKey(ctx, \"charge\") = %s, want %s", op, got, want[1])
		}
		first, retry := as[4*i:4*i+2], as[4*i+2:4*i+4]
		for j := range first {
			k := onlyKey(t, first[j])
			if k != want[j] {
				t.Errorf("%v: call %d carried %s, want the child key %s", op, j, k, want[j])
			}
			if r := onlyKey(t, retry[j]); r != k {
				t.Errorf("%v: retried parent sent child key %s, first execution %s", op, r, k)
			}
			if seen[k] {
				t.Errorf("%v: child key %s was already used by another operation", op, k)
			}
			seen[k] = true
			if n := countEffects(t, downPool, k); n != 1 {
				t.Errorf("%v: %d downstream effects under %s, want 1", op, n, k)
			}
		}
	}
	if n := down.count(); n != 4*2 {
		t.Errorf("downstream handler ran %d times, want 8 (two calls of each of four operations)", n)
	}
}

// propagator is an upstream TestService whose Do forwards its incoming
// metadata, idempotency key included, to its calls of the downstream
// service's Read (NO_SIDE_EFFECTS), Maybe (key optional) and Do (key
// required), then calls Maybe with a key of its own.
type propagator struct {
	testv1.UnimplementedTestServiceServer
	down testv1.TestServiceClient
}

func (p *propagator) Do(ctx context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	out := metadata.NewOutgoingContext(ctx, md)
	if _, err := p.down.Read(out, &testv1.ReadRequest{Value: "read"}); err != nil {
		return nil, err
	}
	if _, err := p.down.Maybe(out, &testv1.MaybeRequest{Value: "maybe"}); err != nil {
		return nil, err
	}
	if _, err := p.down.Do(out, &testv1.DoRequest{Value: "do"}); err != nil {
		return nil, err
	}
	if _, err := p.down.Maybe(idem.ContextWithKey(out, "refund-1"), &testv1.MaybeRequest{Value: "with key"}); err != nil {
		return nil, err
	}
	return &testv1.DoResponse{Value: req.GetValue()}, nil
}

// TestClientNeverForwardsTheRequestKey: a handler that copies its incoming
// metadata to its outgoing calls sends its own key to none of them. A
// method without side effects and an optional-key method that the client
// does not select get no key at all; a keyed method gets the child key, and
// a key set with ContextWithKey is sent as it is.
func TestClientNeverForwardsTheRequestKey(t *testing.T) {
	downPool, upPool := newEffectsPool(t), newEffectsPool(t)
	down := &testService{pool: downPool}
	downRec, downAddr := serve(t, downPool, down)
	up := &propagator{down: dial(t, downAddr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()))}
	_, upAddr := serve(t, upPool, up)
	client := dial(t, upAddr)

	const parent = "order-1"
	ctx := metadata.AppendToOutgoingContext(deadline(t, 30*time.Second), idem.KeyHeader, parent)
	if _, err := client.Do(ctx, &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}

	reads, maybes := downRec.of(methodRead), downRec.of(methodMaybe)
	if len(reads) != 1 || len(maybes) != 2 {
		t.Fatalf("downstream saw %d calls of Read and %d of Maybe, want 1 and 2", len(reads), len(maybes))
	}
	for _, a := range []attempt{reads[0], maybes[0]} {
		if len(a.keys) != 0 {
			t.Errorf("%s received keys %q, want none", a.method, a.keys)
		}
	}
	if k := onlyKey(t, maybes[1]); k != "refund-1" {
		t.Errorf("Maybe with ContextWithKey received %s, want refund-1", k)
	}
	child := onlyKey(t, downRec.of(methodDo)[0])
	if want := idemtest.CallKey(store.Scope{Method: methodDo, Key: parent}, methodDo, 1); child != want {
		t.Errorf("Do received key %s, want the child key %s", child, want)
	}
	// Read and the first Maybe ran without a key, Do under its child key.
	var rows []string
	r, err := downPool.Query(context.Background(), `SELECT value || ' ' || key FROM effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var s string
		if err := r.Scan(&s); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, s)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"read ", "maybe ", "do " + child, "with key refund-1"}; !slices.Equal(rows, want) {
		t.Errorf("downstream effects %q, want %q", rows, want)
	}
}
