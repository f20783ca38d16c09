package oteltest

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fingerprint"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/transport"
)

const (
	methodDo   = "/idem.test.v1.TestService/Do"
	methodRead = "/idem.test.v1.TestService/Read"
	// rpcDo is methodDo as the attribute rpc.method holds it.
	rpcDo = "idem.test.v1.TestService/Do"
	// tenant is the tenant of every call: no attribute may carry it, nor
	// any key, which all contain "SECRET" too.
	tenant = "tenant-SECRET"
	secret = "SECRET"
)

// harness runs calls through Engines that report to one SDK and one hook.
type harness struct {
	tel   *telemetry
	hooks hookRecorder
	clock *clock
	mem   *memory.Store
}

func newHarness(t *testing.T) *harness {
	h := &harness{tel: newTelemetry(t), clock: &clock{now: time.Now()}}
	h.mem = memory.New(memory.WithClock(h.clock.Now), memory.WithLockTimeout(50*time.Millisecond))
	return h
}

// engine returns an Engine on s (the harness's memory store when nil).
func (h *harness) engine(t *testing.T, s store.Store, opts ...idem.Option) *idem.Engine {
	t.Helper()
	if s == nil {
		s = h.mem
	}
	e, err := idem.New(s, append([]idem.Option{
		idem.WithMeterProvider(h.tel.mp),
		idem.WithTracerProvider(h.tel.tp),
		idem.WithReportHook(h.hooks.hook),
		idem.WithTenant(func(context.Context, map[string][]string) (string, error) { return tenant, nil }),
		// The store errors of the cases are meant.
		idem.WithLogger(slog.New(slog.DiscardHandler)),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// clock is the memory store's clock, which a test moves forward.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// call runs a call of method with keys and req through e, in a span of its
// own that stands for the transport's server span, and returns the span.
func (h *harness) call(e *idem.Engine, method string, keys []string, req proto.Message, handler transport.Handler) (transport.Answer, error, sdktrace.ReadOnlySpan) {
	// A transport hands the engine a request decoded for the call, whose
	// key field the engine fills in from the metadata's key: the cases
	// reuse theirs across calls with other keys.
	req = proto.Clone(req)
	ctx, span := h.tel.tp.Tracer("test").Start(context.Background(), "server")
	ans, err := transport.Handle(ctx, e, transport.Call{Method: method, Keys: keys, Request: req, Status: grpcStatus}, handler)
	span.End()
	ended := h.tel.spans.Ended()
	for i := len(ended) - 1; i >= 0; i-- {
		if ended[i].SpanContext().SpanID() == span.SpanContext().SpanID() {
			return ans, err, ended[i]
		}
	}
	panic("the server span was not recorded")
}

// echo is a handler of Do that answers req's value.
func echo(req *testv1.DoRequest) transport.Handler {
	return func(context.Context) (transport.Reply, error) {
		return transport.Reply{Message: &testv1.DoResponse{Value: req.GetValue(), Execution: 1}}, nil
	}
}

// fail is a handler that fails with code c.
func fail(c codes.Code) transport.Handler {
	return func(context.Context) (transport.Reply, error) {
		return transport.Reply{}, status.Error(c, "failed")
	}
}

// grpcStatus reads the status of a gRPC status error, as the gRPC adapter
// does.
func grpcStatus(err error) (*spb.Status, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	return st.Proto(), true
}

// want is what one call must report.
type want struct {
	method   string
	mode     idem.Mode
	result   idem.Result
	replayed bool
	// claim and record: the call claimed a key, recorded an outcome.
	claim, record bool
	takeover      bool
	events        []string
	retryDelay    bool
}

// check runs act, one call, and fails the test unless it reported w and
// nothing else: one count of idem.server.requests with its method, mode
// and outcome, its durations, one outcome to the hook, and the attributes,
// events and child spans of its span.
func (h *harness) check(t *testing.T, name string, w want, act func() (transport.Answer, error, sdktrace.ReadOnlySpan)) {
	t.Helper()
	h.hooks.take()
	before := h.tel.collect(t)
	_, err, span := act()
	changed := diff(before, h.tel.collect(t))

	// Metrics.
	method := w.method
	if method == "" {
		method = methodDo
	}
	rpc := method[1:]
	byMode := attrs("rpc.method", rpc, "idem.mode", string(w.mode))
	reqs := changed["idem.server.requests"]
	wantKey := attrs("rpc.method", rpc, "idem.mode", string(w.mode), "idem.result", string(w.result))
	if p, ok := reqs[wantKey]; len(reqs) != 1 || !ok || p.value != 1 {
		t.Errorf("%s: idem.server.requests moved %v, want exactly one count of {%s}", name, describe(reqs), wantKey)
	}
	for metric, moved := range map[string]bool{"idem.claim.duration": w.claim, "idem.record.duration": w.record} {
		pts := changed[metric]
		p, ok := pts[byMode]
		switch {
		case moved && (len(pts) != 1 || !ok || p.count != 1 || p.sum <= 0):
			t.Errorf("%s: %s moved %v, want one duration of {%s}", name, metric, describe(pts), byMode)
		case !moved && len(pts) != 0:
			t.Errorf("%s: %s moved %v, want nothing", name, metric, describe(pts))
		}
	}
	if pts, p := changed["idem.lease.takeovers"], changed["idem.lease.takeovers"][byMode]; w.takeover != (p.value == 1) || len(pts) > 1 {
		t.Errorf("%s: idem.lease.takeovers moved %v, want a takeover: %v", name, describe(pts), w.takeover)
	}
	for metric := range changed {
		switch metric {
		case "idem.server.requests", "idem.claim.duration", "idem.record.duration", "idem.lease.takeovers":
		default:
			t.Errorf("%s: %s moved %v", name, metric, describe(changed[metric]))
		}
	}

	// The hook.
	got := h.hooks.take()
	if len(got) != 1 {
		t.Fatalf("%s: the hook saw %d outcomes, want 1: %+v", name, len(got), got)
	}
	o := got[0]
	if o.Method != method || o.Mode != w.mode || o.Result != w.result || o.Replayed != w.replayed ||
		(o.ClaimDuration > 0) != w.claim || (o.RecordDuration > 0) != w.record || o.Duration <= 0 {
		t.Errorf("%s: the hook saw %+v, want %+v", name, o, w)
	}

	// The span and its children.
	sa := map[attribute.Key]attribute.Value{}
	for _, kv := range span.Attributes() {
		sa[kv.Key] = kv.Value
	}
	if sa["idem.result"].AsString() != string(w.result) || sa["idem.mode"].AsString() != string(w.mode) ||
		sa["idem.replayed"].Type() != attribute.BOOL || sa["idem.replayed"].AsBool() != w.replayed {
		t.Errorf("%s: span attributes %v, want outcome %s, mode %s, replayed %v", name, span.Attributes(), w.result, w.mode, w.replayed)
	}
	var events []string
	for _, e := range span.Events() {
		events = append(events, e.Name)
	}
	if !equal(events, w.events) {
		t.Errorf("%s: span events %v, want %v", name, events, w.events)
	}
	children := map[string]int{}
	for _, s := range h.tel.spans.Ended() {
		if s.Parent().SpanID() == span.SpanContext().SpanID() {
			children[s.Name()]++
		}
	}
	if children["idem.claim"] != b2i(w.claim) || children["idem.record"] != b2i(w.record) || len(children) > 2 {
		t.Errorf("%s: child spans %v, want idem.claim %v and idem.record %v", name, children, w.claim, w.record)
	}

	// The retry delay, which each transport sends in its own way (gRPC's
	// pushback trailer, HTTP's Retry-After).
	var ie *idem.Error
	delayed := false
	if errors.As(err, &ie) {
		_, delayed = ie.RetryDelay()
	}
	if delayed != w.retryDelay {
		t.Errorf("%s: error %v has a retry delay: %v, want %v", name, err, delayed, w.retryDelay)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func describe(pts map[string]point) map[string]string {
	out := map[string]string{}
	for k, p := range pts {
		if p.count > 0 {
			out[k] = strconv.FormatUint(p.count, 10) + " durations"
		} else {
			out[k] = strconv.FormatInt(p.value, 10)
		}
	}
	return out
}

// failingStore fails every claim, as a database that is down does.
type failingStore struct{ store.Store }

func (failingStore) Claim(context.Context, store.Scope, store.ClaimRequest) (store.Claim, error) {
	return store.Claim{}, errors.New("dial tcp db.internal:5432: connection refused")
}

// losingStore hands out leases whose record finds them taken over.
type losingStore struct{ store.Store }

func (s losingStore) ClaimLeased(ctx context.Context, k store.Scope, r store.LeaseRequest) (store.LeasedClaim, error) {
	c, err := s.Store.ClaimLeased(ctx, k, r)
	if c.Lease != nil {
		c.Lease = losingLease{c.Lease}
	}
	return c, err
}

type losingLease struct{ store.Lease }

func (losingLease) Record(context.Context, store.Outcome) error { return store.ErrLeaseLost }

// refLoader records a reference and rebuilds a response from it.
type refLoader struct{}

func (refLoader) Reference(context.Context, proto.Message) ([]byte, error) { return []byte("ref"), nil }

func (refLoader) Load(context.Context, []byte) (proto.Message, error) {
	return &testv1.DoResponse{Value: "rebuilt"}, nil
}

// TestEveryOutcomeIsReportedOnce: each result a call can end in is counted
// once in idem.server.requests with its method, mode and outcome, its
// durations are recorded, the hook sees it once, and the call's span
// carries it, with child spans for the store calls it made; no attribute
// carries the key or the tenant.
func TestEveryOutcomeIsReportedOnce(t *testing.T) {
	h := newHarness(t)
	atomic := h.engine(t, nil)
	req := &testv1.DoRequest{Value: "v"}
	keys := func(k string) []string { return []string{"key-" + secret + "-" + k} }

	h.check(t, "first call", want{mode: "atomic", result: idem.ResultExecuted, claim: true, record: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(atomic, methodDo, keys("1"), req, echo(req))
	})
	h.check(t, "retry", want{mode: "atomic", result: idem.ResultReplayed, replayed: true, claim: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(atomic, methodDo, keys("1"), req, echo(req))
	})
	other := &testv1.DoRequest{Value: "other"}
	h.check(t, "key reused", want{mode: "atomic", result: idem.ResultReused, claim: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(atomic, methodDo, keys("1"), other, echo(other))
	})
	h.check(t, "invalid key", want{mode: "atomic", result: idem.ResultInvalidKey}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(atomic, methodDo, []string{"a " + secret}, req, echo(req))
	})
	h.check(t, "missing key", want{mode: "atomic", result: idem.ResultMissingKey}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(atomic, methodDo, nil, req, echo(req))
	})
	read := &testv1.ReadRequest{Value: "v"}
	h.check(t, "no side effects", want{method: methodRead, mode: "atomic", result: idem.ResultPassthrough}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(atomic, methodRead, keys("read"), read, func(context.Context) (transport.Reply, error) {
			return transport.Reply{Message: &testv1.ReadResponse{Value: "v"}}, nil
		})
	})
	h.check(t, "transient error", want{mode: "atomic", result: idem.ResultTransient, claim: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(atomic, methodDo, keys("2"), req, fail(codes.Unavailable))
	})
	h.check(t, "store down", want{mode: "atomic", result: idem.ResultStoreError, claim: true, retryDelay: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(h.engine(t, failingStore{h.mem}), methodDo, keys("3"), req, echo(req))
	})

	// Responses too large to record.
	small := idem.WithMaxStoredResponseBytes(1)
	notCached := h.engine(t, nil, small)
	h.call(notCached, methodDo, keys("4"), req, echo(req))
	h.check(t, "not cached", want{mode: "atomic", result: idem.ResultNotCached, claim: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(notCached, methodDo, keys("4"), req, echo(req))
	})
	rebuilt := h.engine(t, nil, small, idem.WithMethodPolicy(methodDo, idem.MethodPolicy{KeyRequired: true, Loader: refLoader{}}))
	h.call(rebuilt, methodDo, keys("5"), req, echo(req))
	h.check(t, "rebuilt", want{mode: "atomic", result: idem.ResultRebuilt, replayed: true, claim: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(rebuilt, methodDo, keys("5"), req, echo(req))
	})
	rerun := h.engine(t, nil, small, idem.WithMethodPolicy(methodDo, idem.MethodPolicy{KeyRequired: true, RerunWhenNotCached: true}))
	h.call(rerun, methodDo, keys("6"), req, echo(req))
	h.check(t, "rerun", want{mode: "atomic", result: idem.ResultRerun, claim: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(rerun, methodDo, keys("6"), req, echo(req))
	})

	// Leased mode.
	leased := idem.WithMethodPolicy(methodDo, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute})
	lease := h.engine(t, nil, leased)
	h.check(t, "leased call", want{mode: "leased", result: idem.ResultExecuted, claim: true, record: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(lease, methodDo, keys("7"), req, echo(req))
	})
	// A duplicate while the first call runs.
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		h.call(lease, methodDo, keys("8"), req, func(context.Context) (transport.Reply, error) {
			close(entered)
			<-release
			return transport.Reply{Message: &testv1.DoResponse{Value: "v"}}, nil
		})
	}()
	<-entered
	h.check(t, "key in use", want{mode: "leased", result: idem.ResultInUse, claim: true, events: []string{"idem.key_in_use"}, retryDelay: true},
		func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
			return h.call(lease, methodDo, keys("8"), req, echo(req))
		})
	close(release)
	<-done
	h.check(t, "lease lost", want{mode: "leased", result: idem.ResultLeaseLost, claim: true, record: true, retryDelay: true}, func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
		return h.call(h.engine(t, losingStore{h.mem}, leased), methodDo, keys("9"), req, echo(req))
	})
	// A lease that ran out under an earlier worker is taken over.
	fp, err := fingerprint.NewHasher().Sum(req)
	if err != nil {
		t.Fatal(err)
	}
	abandoned, err := h.mem.ClaimLeased(context.Background(), store.Scope{Tenant: tenant, Method: methodDo, Key: keys("10")[0]}, store.LeaseRequest{Fingerprint: fp, Lease: time.Second})
	if err != nil || abandoned.Lease == nil {
		t.Fatalf("lease: %+v, %v", abandoned, err)
	}
	h.clock.advance(2 * time.Second)
	h.check(t, "takeover", want{mode: "leased", result: idem.ResultExecuted, claim: true, record: true, takeover: true, events: []string{"idem.lease.takeover"}},
		func() (transport.Answer, error, sdktrace.ReadOnlySpan) {
			return h.call(lease, methodDo, keys("10"), req, echo(req))
		})

	// Every result was checked, but not_finished, which only a Finisher
	// reaches: see TestAbandonedCallGivenUpIsReported.
	seen := map[idem.Result]bool{}
	for _, p := range h.tel.collect(t)["idem.server.requests"] {
		v, _ := p.attrs.Value("idem.result")
		seen[idem.Result(v.AsString())] = true
	}
	for _, r := range []idem.Result{
		idem.ResultExecuted, idem.ResultReplayed, idem.ResultInUse, idem.ResultReused,
		idem.ResultInvalidKey, idem.ResultMissingKey, idem.ResultPassthrough, idem.ResultNotCached,
		idem.ResultRebuilt, idem.ResultRerun, idem.ResultLeaseLost, idem.ResultStoreError,
		idem.ResultTransient,
	} {
		if !seen[r] {
			t.Errorf("no call was counted with outcome %s", r)
		}
	}
	wantNoSecrets(t, h.tel, secret)
}

// TestLeaseExtensionsAreCounted: the heartbeat of a leased call counts each
// extension in idem.lease.extensions.
func TestLeaseExtensionsAreCounted(t *testing.T) {
	h := newHarness(t)
	e := h.engine(t, memory.New(), idem.WithMethodPolicy(methodDo, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: 30 * time.Millisecond}))
	req := &testv1.DoRequest{Value: "v"}
	key := attrs("rpc.method", rpcDo, "idem.mode", "leased")
	_, err, _ := h.call(e, methodDo, []string{"key-" + secret}, req, func(ctx context.Context) (transport.Reply, error) {
		// Run until the heartbeat has extended the lease twice.
		for h.tel.collect(t)["idem.lease.extensions"][key].value < 2 {
			select {
			case <-ctx.Done():
				return transport.Reply{}, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		return transport.Reply{Message: &testv1.DoResponse{Value: "v"}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.hooks.take(); len(got) != 1 || got[0].Result != idem.ResultExecuted {
		t.Errorf("the hook saw %+v, want one executed call", got)
	}
	wantNoSecrets(t, h.tel, secret)
}

// TestPanickingHookLeavesTheAnswerAndTheMetrics: a hook that panics changes
// neither the answer nor what is counted.
func TestPanickingHookLeavesTheAnswerAndTheMetrics(t *testing.T) {
	tel := newTelemetry(t)
	e, err := idem.New(memory.New(),
		idem.WithMeterProvider(tel.mp),
		idem.WithReportHook(func(context.Context, idem.Report) { panic("hook bug") }),
		idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	req := &testv1.DoRequest{Value: "v"}
	for i, want := range []idem.Result{idem.ResultExecuted, idem.ResultReplayed} {
		ans, err := transport.Handle(context.Background(), e, transport.Call{Method: methodDo, Keys: []string{"k"}, Request: req}, echo(req))
		if err != nil || ans.Message.(*testv1.DoResponse).GetValue() != "v" {
			t.Fatalf("call %d with a panicking hook: %v, %v", i, ans.Message, err)
		}
		key := attrs("rpc.method", rpcDo, "idem.mode", "atomic", "idem.result", string(want))
		if n := tel.collect(t)["idem.server.requests"][key].value; n != 1 {
			t.Errorf("call %d: %d counts of {%s}, want 1", i, n, key)
		}
	}
}

// unavailable is a TestService whose Do always fails transiently.
type unavailable struct {
	testv1.UnimplementedTestServiceServer
}

func (unavailable) Do(context.Context, *testv1.DoRequest) (*testv1.DoResponse, error) {
	return nil, status.Error(codes.Unavailable, "provider down")
}

// TestAbandonedCallGivenUpIsReported: a Finisher's attempt at an abandoned
// call is reported as any call (here a transient failure, after a
// takeover), and the call it gives up on as not_finished, once.
func TestAbandonedCallGivenUpIsReported(t *testing.T) {
	h := newHarness(t)
	e := h.engine(t, nil, idem.WithMethodPolicy(methodDo, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute, Finish: true}))
	req := &testv1.DoRequest{Value: "v"}
	// A call that passed a step and then failed leaves its claim, its
	// lease ended, for a finisher.
	_, err, _ := h.call(e, methodDo, []string{"key-" + secret + "-abandoned"}, req, func(ctx context.Context) (transport.Reply, error) {
		if _, err := idem.Step(ctx, "charge", func(context.Context) ([]byte, error) { return []byte("ch_1"), nil }); err != nil {
			return transport.Reply{}, err
		}
		return transport.Reply{}, status.Error(codes.Unavailable, "worker lost")
	})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("the abandoned call: %v, want UNAVAILABLE", err)
	}
	f, err := idem.NewFinisher(e, idem.WithGrace(time.Millisecond), idem.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	testv1.RegisterTestServiceServer(interceptor.FinisherRegistrar(f), unavailable{})

	h.hooks.take()
	before := h.tel.collect(t)
	for pass, want := range []int{0, 1} { // the attempt fails; then the call is given up
		h.clock.advance(time.Second) // past the grace, doubled after the failed attempt
		if n, err := f.Finish(context.Background()); err != nil || n != want {
			t.Fatalf("pass %d finished %d calls, %v; want %d", pass, n, err, want)
		}
	}
	changed := diff(before, h.tel.collect(t))
	leased := func(outcome string) string {
		return attrs("rpc.method", rpcDo, "idem.mode", "leased", "idem.result", outcome)
	}
	reqs := changed["idem.server.requests"]
	if len(reqs) != 2 || reqs[leased("transient")].value != 1 || reqs[leased("not_finished")].value != 1 {
		t.Errorf("idem.server.requests moved %v, want one transient attempt and one not_finished", describe(reqs))
	}
	if n := changed["idem.lease.takeovers"][attrs("rpc.method", rpcDo, "idem.mode", "leased")].value; n != 1 {
		t.Errorf("idem.lease.takeovers moved by %d, want the attempt's takeover", n)
	}
	var results []idem.Result
	for _, o := range h.hooks.take() {
		results = append(results, o.Result)
	}
	if !equal([]string{string(idem.ResultTransient), string(idem.ResultNotFinished)}, toStrings(results)) {
		t.Errorf("the hook saw %v, want transient then not_finished", results)
	}
	wantNoSecrets(t, h.tel, secret)
}

func toStrings(rs []idem.Result) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	return out
}
