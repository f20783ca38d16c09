package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fingerprint"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
	"github.com/idemkit/idem/transport"
)

// provider stands for a payment provider that deduplicates charges by the
// key each charge carries, as real ones do.
type provider struct {
	mu      sync.Mutex
	charges map[string]int // by key: calls received
}

// providerKeys gives the key each charge carries, as idem's client
// interceptors would: the child key of the step that Step names in ctx.
var providerKeys = transport.NewOutgoingKeys()

func (p *provider) charge(ctx context.Context) string {
	_, keys, _, _ := providerKeys.For(ctx, doMethod, nil, nil)
	key := keys[0]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.charges == nil {
		p.charges = map[string]int{}
	}
	p.charges[key]++
	return "ch_" + key[:8]
}

// distinct returns how many distinct charges the provider made.
func (p *provider) distinct() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// finishable is a leased, finishable Do on a store of each kind, with a
// finisher on the same engine.
type finishable struct {
	*env
	finisher *idem.Finisher
	engine   *idem.Engine
	store    store.Store
	outcomes *outcomeLog
	// finisherLog holds what the finisher's engine logged.
	finisherLog *logBuffer
}

// outcomeLog keeps the reports of the calls a finisher ran, as the
// report hook saw them.
type outcomeLog struct {
	mu   sync.Mutex
	seen []idem.Report
}

func (l *outcomeLog) hook(_ context.Context, o idem.Report) {
	if !o.Finishing {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, o)
}

// results returns the results seen, in order.
func (l *outcomeLog) results() []idem.Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []idem.Result
	for _, o := range l.seen {
		out = append(out, o.Result)
	}
	return out
}

func eachFinishableStore(t *testing.T, f func(t *testing.T, c *finishable)) {
	t.Helper()
	eachFinishableStoreWith(t, nil, f)
}

// eachFinishableStoreWith is eachFinishableStore with the finisher
// configured by opts, after the tests' own (no grace, three attempts).
func eachFinishableStoreWith(t *testing.T, opts []idem.FinisherOption, f func(t *testing.T, c *finishable)) {
	t.Helper()
	for _, mem := range []bool{false, true} {
		name := "postgres"
		if mem {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) {
			f(t, newFinishable(t, mem, opts))
		})
	}
}

// newFinishable returns a finishable Do on store/memory, or, unless mem,
// on PostgreSQL, with a finisher configured by fopts, after three attempts
// and newFinisher's own options, that runs ics around its calls.
func newFinishable(t *testing.T, mem bool, fopts []idem.FinisherOption, ics ...grpc.UnaryServerInterceptor) *finishable {
	t.Helper()
	outcomes := &outcomeLog{}
	opts := []idem.Option{
		idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute, Finish: true, FinishHeaders: []string{"x-user"}}),
		idem.WithTenant(idemtest.TenantFromHeader),
		idem.WithReportHook(outcomes.hook),
	}
	var st store.Store
	s := setup{memory: mem, opts: opts}
	s.store = func(pool *pgxpool.Pool) store.Store {
		st = postgres.New(pool)
		return st
	}
	if mem {
		st = memory.New()
		s.memoryStore = st
	}
	e := newEnv(t, s)
	log := &logBuffer{}
	engine := idemtest.NewEngine(t, st, append(opts, idem.WithLogger(log.logger()))...)
	fopts = append([]idem.FinisherOption{idem.WithMaxAttempts(3)}, fopts...)
	c := newFinisher(t, engine, fopts, e.svc, ics...)
	return &finishable{env: e, finisher: c, engine: engine, store: st, outcomes: outcomes, finisherLog: log}
}

// abandon makes a call whose handler passes the charge step and then dies,
// as a crashed worker's would: the call's claim is left with its lease run
// out, and the client gets an error.
func abandon(t *testing.T, c *finishable, key string) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(withKey(key), "x-tenant-id", "acme", "x-user", "u-7")
	_, err := c.client.Do(ctx, &testv1.DoRequest{Value: "v"})
	if status.Code(err) != codes.Unknown {
		t.Fatalf("the abandoned call got %v, want the panic's UNKNOWN", err)
	}
}

func TestFinisherFinishesAnAbandonedCall(t *testing.T) {
	eachFinishableStore(t, func(t *testing.T, c *finishable) {
		p := &provider{}
		var (
			crash      atomic.Bool
			users      sync.Map
			finishRuns atomic.Int32
		)
		crash.Store(true)
		c.svc.setHook(func(ctx context.Context, _ string) error {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-user")) == 1 {
				users.Store(md.Get("x-user")[0], true)
			}
			if _, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
				return []byte(p.charge(ctx)), nil
			}); err != nil {
				return err
			}
			if crash.Swap(false) {
				panic("worker dies between the charge and the order")
			}
			finishRuns.Add(1)
			return nil
		})
		abandon(t, c, "order-1")

		n, err := c.finisher.Finish(t.Context())
		if err != nil || n != 1 {
			t.Fatalf("Finish = %d, %v; want the abandoned call finished", n, err)
		}
		if p.distinct() != 1 || finishRuns.Load() != 1 {
			t.Fatalf("%d charges and %d finished runs, want 1 and 1", p.distinct(), finishRuns.Load())
		}
		if _, ok := users.Load("u-7"); !ok {
			t.Error("the finisher's run did not see the allowlisted metadata")
		}
		// The caller's late retry replays the outcome the finisher recorded.
		var header metadata.MD
		ctx := metadata.AppendToOutgoingContext(withKey("order-1"), "x-tenant-id", "acme")
		if _, err := c.client.Do(ctx, &testv1.DoRequest{Value: "v"}, grpc.Header(&header)); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Fatalf("late retry: %v (header %v), want a replay", err, header)
		}
		if n, _ := c.finisher.Finish(t.Context()); n != 0 {
			t.Errorf("a second pass finished %d calls, want none", n)
		}
		if c.pool != nil {
			if k := c.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE request_payload IS NOT NULL`); k != 0 {
				t.Errorf("%d rows still hold a request after their outcome", k)
			}
		}
	})
}

func TestFinishersAndALateRetryRace(t *testing.T) {
	eachFinishableStore(t, func(t *testing.T, c *finishable) {
		p := &provider{}
		var crash atomic.Bool
		var finishRuns, met atomic.Int32
		crash.Store(true)
		c.svc.setHook(func(ctx context.Context, _ string) error {
			if _, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
				return []byte(p.charge(ctx)), nil
			}); err != nil {
				return err
			}
			if crash.Swap(false) {
				panic("worker dies")
			}
			// The run holds until the other two contenders have
			// met it and given up.
			if !idemtest.Eventually(30*time.Second, func() bool { return met.Load() >= 2 }) {
				return status.Error(codes.Internal, "the other contenders never met the run")
			}
			finishRuns.Add(1)
			return nil
		})
		abandon(t, c, "order-2")
		other := newFinisher(t, c.engine, nil, c.svc)
		var wg sync.WaitGroup
		var retryErr error
		wg.Go(func() {
			defer met.Add(1)
			_, _ = c.finisher.Finish(t.Context())
		})
		wg.Go(func() {
			defer met.Add(1)
			_, _ = other.Finish(t.Context())
		})
		wg.Go(func() {
			defer met.Add(1)
			ctx := metadata.AppendToOutgoingContext(withKey("order-2"), "x-tenant-id", "acme")
			_, retryErr = c.client.Do(ctx, &testv1.DoRequest{Value: "v"})
		})
		wg.Wait()
		if retryErr != nil && status.Code(retryErr) != codes.Aborted {
			t.Errorf("the racing retry got %v, want OK or ABORTED", retryErr)
		}
		if finishRuns.Load() != 1 || p.distinct() != 1 {
			t.Fatalf("%d finished runs and %d charges, want 1 and 1", finishRuns.Load(), p.distinct())
		}
	})
}

func TestFinisherRecordsADeterministicError(t *testing.T) {
	eachFinishableStore(t, func(t *testing.T, c *finishable) {
		var runs atomic.Int32
		c.svc.setHook(func(ctx context.Context, _ string) error {
			if runs.Add(1) == 1 {
				if _, err := idem.Step(ctx, "started", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
					return err
				}
				panic("worker dies")
			}
			return status.Error(codes.FailedPrecondition, "the cart is empty")
		})
		abandon(t, c, "order-3")
		if n, err := c.finisher.Finish(t.Context()); err != nil || n != 1 {
			t.Fatalf("Finish = %d, %v", n, err)
		}
		ctx := metadata.AppendToOutgoingContext(withKey("order-3"), "x-tenant-id", "acme")
		_, err := c.client.Do(ctx, &testv1.DoRequest{Value: "v"})
		if st := wantCode(t, err, codes.FailedPrecondition); st.Message() != "the cart is empty" {
			t.Errorf("replayed %q", st.Message())
		}
		if runs.Load() != 2 {
			t.Errorf("%d runs, want 2", runs.Load())
		}
	})
}

// TestFinisherRetriesATransientFailureBeforeAnyStep: a finishable call
// that fails transiently before it saves a step (its first step timed out
// at the provider, say) keeps its claim and its request, with the lease
// ended, and so does a finisher run that fails alike: a later pass
// finishes it. Releasing such a claim as a plain leased one (deleting it)
// would leave whatever the step did half done, with no one to finish it.
func TestFinisherRetriesATransientFailureBeforeAnyStep(t *testing.T) {
	eachFinishableStore(t, func(t *testing.T, c *finishable) {
		var runs atomic.Int32
		c.svc.setHook(func(context.Context, string) error {
			if runs.Add(1) <= 2 {
				return status.Error(codes.Unavailable, "the provider timed out")
			}
			return nil
		})
		ctx := metadata.AppendToOutgoingContext(withKey("order-5"), "x-tenant-id", "acme")
		if _, err := c.client.Do(ctx, &testv1.DoRequest{Value: "v"}); status.Code(err) != codes.Unavailable {
			t.Fatalf("first call: %v, want the handler's UNAVAILABLE", err)
		}
		// The client gives up. The first pass fails as the call did, the
		// second finishes it.
		if n, err := c.finisher.Finish(t.Context()); err != nil || n != 0 {
			t.Fatalf("first pass: Finish = %d, %v; want the transient failure left for later", n, err)
		}
		if n, err := c.finisher.Finish(t.Context()); err != nil || n != 1 {
			t.Fatalf("second pass: Finish = %d, %v; want the call finished", n, err)
		}
		if runs.Load() != 3 {
			t.Fatalf("%d runs, want the call's and two finisher runs", runs.Load())
		}
		var header metadata.MD
		if _, err := c.client.Do(ctx, &testv1.DoRequest{Value: "v"}, grpc.Header(&header)); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Fatalf("late retry: %v (header %v), want a replay", err, header)
		}
		if runs.Load() != 3 {
			t.Errorf("%d runs after the late retry, want 3", runs.Load())
		}
	})
}

func TestFinisherGivesUpAfterItsAttempts(t *testing.T) {
	eachFinishableStore(t, func(t *testing.T, c *finishable) {
		c.svc.setHook(func(ctx context.Context, _ string) error {
			if _, err := idem.Step(ctx, "started", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "the provider is down")
		})
		ctx := metadata.AppendToOutgoingContext(withKey("order-4"), "x-tenant-id", "acme")
		if _, err := c.client.Do(ctx, &testv1.DoRequest{Value: "v"}); status.Code(err) != codes.Unavailable {
			t.Fatalf("first call: %v", err)
		}
		var total int
		for range 5 {
			n, err := c.finisher.Finish(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
		if total != 1 {
			t.Fatalf("%d calls finished over five passes, want 1 (recorded as failed)", total)
		}
		_, err := c.client.Do(ctx, &testv1.DoRequest{Value: "v"})
		st := wantCode(t, err, codes.FailedPrecondition)
		if info := errorInfo(st); info.GetReason() != idem.ReasonNotFinished {
			t.Errorf("reason %q, want %s", info.GetReason(), idem.ReasonNotFinished)
		}
		if n := c.svc.count(); n != 4 {
			t.Errorf("%d executions, want the first and three finisher attempts", n)
		}
	})
}

func TestStepRunsOncePerCall(t *testing.T) {
	s := setup{opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute})}}
	eachStore(t, s, func(t *testing.T, e *env) {
		p := &provider{}
		var fail atomic.Bool
		fail.Store(true)
		var got []string
		e.svc.setHook(func(ctx context.Context, _ string) error {
			charge, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
				return []byte(p.charge(ctx)), nil
			})
			if err != nil {
				return err
			}
			if fail.Swap(false) {
				return status.Error(codes.Unavailable, "confirming failed") // the lease ends; the steps stay
			}
			ship, err := idem.Step(ctx, "ship", func(context.Context) ([]byte, error) { return []byte("sh_1"), nil })
			got = []string{string(charge), string(ship)}
			return err
		})
		_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
		wantCode(t, err, codes.Unavailable)
		if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
			t.Fatalf("retry: %v", err)
		}
		if p.distinct() != 1 || len(got) != 2 || got[1] != "sh_1" {
			t.Fatalf("%d charges, steps %v; want one charge and both steps", p.distinct(), got)
		}
		_, err = idem.Step(context.Background(), "x", nil)
		if !errors.Is(err, idem.ErrNotLeased) {
			t.Errorf("Step outside a leased call: %v", err)
		}
	})
}

// crashFirstRun returns a hook under which each key's first run dies, as a
// crashed worker's would, and every later run calls then (nil: succeeds).
func crashFirstRun(then func(ctx context.Context, key string) error) func(ctx context.Context, _ string) error {
	var ran sync.Map
	return func(ctx context.Context, _ string) error {
		key, _ := idem.KeyFromContext(ctx)
		if _, again := ran.LoadOrStore(key, true); !again {
			panic("worker dies")
		}
		if then == nil {
			return nil
		}
		return then(ctx, key)
	}
}

// forAcme returns the outgoing context of a call of tenant acme with key.
func forAcme(key string) context.Context {
	return metadata.AppendToOutgoingContext(withKey(key), "x-tenant-id", "acme", "x-user", "u-7")
}

// logLine returns the line of log that contains every one of subs, or "".
func logLine(log string, subs ...string) string {
	for line := range strings.Lines(log) {
		found := true
		for _, s := range subs {
			found = found && strings.Contains(line, s)
		}
		if found {
			return line
		}
	}
	return ""
}

// TestFinisherSetsAsideAnUnreadableCall: of three abandoned calls, one
// whose kept metadata is damaged in its row is recorded as failed (its
// retry gets FAILED_PRECONDITION, IDEMPOTENCY_NOT_FINISHED), logged at
// ERROR with its scope and counted, and the two others are finished in
// the same pass. Before, the one row failed every pass's listing, and no
// call was finished at all.
func TestFinisherSetsAsideAnUnreadableCall(t *testing.T) {
	c := newFinishable(t, false, nil)
	c.svc.setHook(crashFirstRun(nil))
	const secret = "card-4242-4242-4242"
	for _, k := range []string{"u-1", "u-2", "u-3"} {
		_, err := c.client.Do(forAcme(k), &testv1.DoRequest{Value: secret})
		wantCode(t, err, codes.Unknown)
	}
	tag, err := c.pool.Exec(context.Background(), `UPDATE idempotency_keys SET request_header_names = '{NULL}', request_header_values = '{x}' WHERE key = 'u-2'`)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("damaging u-2's row: %v, %v", tag, err)
	}

	n, err := c.finisher.Finish(t.Context())
	if err != nil || n != 3 {
		t.Fatalf("Finish = %d, %v; want the 2 healthy calls finished and the damaged one recorded as failed", n, err)
	}
	if k := c.countRows(t, `SELECT count(*) FROM idempotency_keys
WHERE key IN ('u-1', 'u-3') AND status = 'recorded' AND response_code = 0 AND request_payload IS NULL`); k != 2 {
		t.Errorf("%d of the healthy calls recorded OK, want 2", k)
	}
	if k := c.countRows(t, `SELECT count(*) FROM idempotency_keys
WHERE key = 'u-2' AND status = 'recorded' AND response_code = $1 AND request_payload IS NULL AND request_header_names IS NULL`, int32(codes.FailedPrecondition)); k != 1 {
		t.Errorf("the damaged call is not recorded as FAILED_PRECONDITION without what was kept")
	}
	if runs := c.svc.count(); runs != 5 {
		t.Errorf("%d runs, want 5: the three first, and the finisher's of the healthy calls", runs)
	}
	log := c.finisherLog.String()
	if logLine(log, "level=ERROR", "cannot be read", "tenant=acme", "key=u-2", "method="+doMethod) == "" {
		t.Errorf("no ERROR line names the damaged call:\n%s", log)
	}
	if strings.Contains(log, secret) {
		t.Errorf("the log shows the request:\n%s", log)
	}
	if got := c.outcomes.results(); !slices.Equal(slices.Sorted(slices.Values(got)),
		[]idem.Result{idem.ResultExecuted, idem.ResultExecuted, idem.ResultUnreadable}) {
		t.Errorf("the finisher reported %v, want two executed and one unreadable", got)
	}

	// Every retry of the damaged call gets the same final answer.
	for range 2 {
		_, err = c.client.Do(forAcme("u-2"), &testv1.DoRequest{Value: secret})
		if st := wantCode(t, err, codes.FailedPrecondition); errorInfo(st).GetReason() != idem.ReasonNotFinished {
			t.Fatalf("retry of the damaged call: %v, want reason %s", st.Details(), idem.ReasonNotFinished)
		}
	}
	if n, err := c.finisher.Finish(t.Context()); n != 0 || err != nil {
		t.Errorf("the next pass: Finish = %d, %v; want nothing left", n, err)
	}
}

// TestFinisherSetsAsideARequestThatDoesNotDecode: a kept request that is
// not a request of its method is recorded as failed at once, without
// running the handler, instead of being tried again at every pass.
func TestFinisherSetsAsideARequestThatDoesNotDecode(t *testing.T) {
	eachFinishableStore(t, func(t *testing.T, c *finishable) {
		req := &testv1.DoRequest{Value: "v"}
		fp, err := fingerprint.NewHasher().Sum(req)
		if err != nil {
			t.Fatal(err)
		}
		key := store.Scope{Tenant: "acme", Method: doMethod, Key: "garbled"}
		lc, err := c.store.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp,
			Call: &store.Call{Method: doMethod, Request: []byte{0xff}}, Lease: time.Hour})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease: %+v, %v", lc, err)
		}
		// Its worker failed before any step: the claim stays, for a
		// finisher, with its lease ended.
		if err := lc.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}

		if n, err := c.finisher.Finish(t.Context()); err != nil || n != 1 {
			t.Fatalf("Finish = %d, %v; want the call recorded as failed", n, err)
		}
		if runs := c.svc.count(); runs != 0 {
			t.Errorf("the handler ran %d times, want never", runs)
		}
		if got := c.outcomes.results(); !slices.Equal(got, []idem.Result{idem.ResultUnreadable}) {
			t.Errorf("the finisher reported %v, want unreadable", got)
		}
		if logLine(c.finisherLog.String(), "level=ERROR", "cannot be read", "key=garbled", "not a request of") == "" {
			t.Errorf("no ERROR line names the call:\n%s", c.finisherLog.String())
		}
		_, err = c.client.Do(forAcme("garbled"), req)
		if st := wantCode(t, err, codes.FailedPrecondition); errorInfo(st).GetReason() != idem.ReasonNotFinished {
			t.Errorf("retry: %v, want reason %s", st.Details(), idem.ReasonNotFinished)
		}
		if n, err := c.finisher.Finish(t.Context()); n != 0 || err != nil {
			t.Errorf("the next pass: Finish = %d, %v; want nothing left", n, err)
		}
		if runs := c.svc.count(); runs != 0 {
			t.Errorf("the handler ran %d times, want never", runs)
		}
	})
}

// finishableOpts are the server options of the finisher tests that
// build their own store.
var finishableOpts = []idem.Option{
	idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute, Finish: true}),
	idem.WithTenant(idemtest.TenantFromHeader),
}

// newFinisherOn returns a finisher of e's service on st, configured by
// opts as newFinisher does, logging to log.
func newFinisherOn(t *testing.T, e *env, st store.Store, log *logBuffer, opts ...idem.FinisherOption) *idem.Finisher {
	t.Helper()
	engine := idemtest.NewEngine(t, st, append(slices.Clone(finishableOpts), idem.WithLogger(log.logger()))...)
	return newFinisher(t, engine, opts, e.svc)
}

// newFinisher returns a finisher on engine with no grace (a call is
// abandoned once its lease ran out) and then opts, with svc registered on
// it through interceptor.FinisherRegistrar, behind ics.
func newFinisher(t *testing.T, engine *idem.Engine, opts []idem.FinisherOption, svc testv1.TestServiceServer, ics ...grpc.UnaryServerInterceptor) *idem.Finisher {
	t.Helper()
	f, err := idem.NewFinisher(engine, append([]idem.FinisherOption{idem.WithGrace(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	testv1.RegisterTestServiceServer(interceptor.FinisherRegistrar(f, ics...), svc)
	return f
}

// TestFinisherSurvivesAPanickingRoute: a shard route that panics for one
// tenant, whose abandoned call has used up its attempts, is that call's
// error: the pass goes on and finishes the healthy call listed after it.
// Before, the finisher's giveUp called the route outside any recover,
// and the pass (and under Run, the process) died.
func TestFinisherSurvivesAPanickingRoute(t *testing.T) {
	shards := twoShardDatabases(t)
	var broken atomic.Bool
	route := func(tenant string) int {
		if tenant == "boom" && broken.Load() {
			return []int{}[len(tenant)] // a bug: index out of range
		}
		return 0
	}
	st := postgres.NewSharded(shards, route)
	e := serveEnv(t, setup{opts: finishableOpts}, nil, st)
	log := &logBuffer{}
	finisher := newFinisherOn(t, e, st, log, idem.WithMaxAttempts(1))
	e.svc.setHook(crashFirstRun(nil))
	for _, tenant := range []string{"boom", "alpha"} {
		_, err := e.client.Do(forTenant(tenant, tenant+"-1"), &testv1.DoRequest{Value: tenant})
		wantCode(t, err, codes.Unknown)
	}
	// boom's call has used up its attempt, and is listed first.
	exec := func(sql string) {
		if _, err := shards[0].Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE idempotency_keys SET takeovers = 1, locked_until = now() - interval '1 hour' WHERE tenant = 'boom'`)
	broken.Store(true)

	n, err := finisher.Finish(t.Context())
	if err != nil || n != 1 {
		t.Fatalf("Finish = %d, %v; want alpha's call finished", n, err)
	}
	if k := countOn(t, shards[0], `SELECT count(*) FROM idempotency_keys WHERE tenant = 'alpha' AND status = 'recorded'`); k != 1 {
		t.Errorf("alpha's call is not recorded")
	}
	if k := countOn(t, shards[0], `SELECT count(*) FROM idempotency_keys WHERE tenant = 'boom' AND status = 'in_progress'`); k != 1 {
		t.Errorf("boom's call is not left in progress")
	}
	if logLine(log.String(), "tenant=boom", postgres.ErrNoShard.Error(), "route panicked", "index out of range") == "" {
		t.Errorf("the log does not say boom's route panicked:\n%s", log.String())
	}
	// The tenant's calls fail as those of a tenant without a shard do.
	_, err = e.client.Do(forTenant("boom", "order-2"), &testv1.DoRequest{Value: "boom"})
	wantCode(t, err, codes.Unavailable)
}

// panickyStore is store/memory, whose ClaimLeased panics for tenant boom
// once armed: a driver's bug.
type panickyStore struct {
	*memory.Store
	armed atomic.Bool
}

func (s *panickyStore) ClaimLeased(ctx context.Context, key store.Scope, r store.LeaseRequest) (store.LeasedClaim, error) {
	if key.Tenant == "boom" && s.armed.Load() {
		panic("the store's driver crashed")
	}
	return s.Store.ClaimLeased(ctx, key, r)
}

// TestFinisherSurvivesAPanicInOneCall: whatever panics while one call is
// taken on (here the store, while the finisher gives the call up), the
// pass goes on with the others.
func TestFinisherSurvivesAPanicInOneCall(t *testing.T) {
	ps := &panickyStore{Store: memory.New()}
	e := serveEnv(t, setup{memory: true, opts: finishableOpts}, nil, ps)
	log := &logBuffer{}
	finisher := newFinisherOn(t, e, ps, log, idem.WithMaxAttempts(1))
	e.svc.setHook(crashFirstRun(nil))
	for _, tenant := range []string{"boom", "alpha"} {
		_, err := e.client.Do(forTenant(tenant, tenant+"-1"), &testv1.DoRequest{Value: tenant})
		wantCode(t, err, codes.Unknown)
	}
	// boom's call is taken over once more, as by a retry that died too:
	// it has used up its attempt.
	list, err := ps.Abandoned(t.Context(), 0, 10)
	if err != nil || len(list) != 2 {
		t.Fatalf("Abandoned = %v, %v", list, err)
	}
	for _, a := range list {
		if a.Scope.Tenant != "boom" {
			continue
		}
		lc, err := ps.ClaimLeased(t.Context(), a.Scope, store.LeaseRequest{Fingerprint: a.Fingerprint, Lease: time.Hour})
		if err != nil || !lc.TookOver {
			t.Fatalf("takeover: %+v, %v", lc, err)
		}
		if err := lc.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	ps.armed.Store(true)

	n, err := finisher.Finish(t.Context())
	if err != nil || n != 1 {
		t.Fatalf("Finish = %d, %v; want alpha's call finished", n, err)
	}
	if logLine(log.String(), "level=ERROR", "panicked", "tenant=boom", "the store's driver crashed") == "" {
		t.Errorf("the log does not report boom's panic:\n%s", log.String())
	}
	var header metadata.MD
	if _, err := e.client.Do(forTenant("alpha", "alpha-1"), &testv1.DoRequest{Value: "alpha"}, grpc.Header(&header)); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
		t.Errorf("alpha's retry: %v (header %v), want a replay", err, header)
	}
}

// blackholePool returns a pool of a "database" that accepts connections
// and never answers, as a shard behind a broken network or a stuck proxy
// does, and the number of connections it has accepted so far.
func blackholePool(t *testing.T) (*pgxpool.Pool, func() int) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	pool, err := pgxpool.New(context.Background(), "postgres://root@"+lis.Addr().String()+"/blackhole?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // first: it ends the connection attempts
	return pool, func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
}

// passResult is what a Finish in a goroutine returned.
type passResult struct {
	n   int
	err error
}

// finishWithin runs c.Finish with ctx and returns its result, failing
// the test if it has not returned within d: a pass that never ends is
// what the tests that use it guard against.
func finishWithin(t *testing.T, ctx context.Context, c *idem.Finisher, d time.Duration) passResult {
	t.Helper()
	done := make(chan passResult, 1)
	go func() {
		n, err := c.Finish(ctx)
		done <- passResult{n, err}
	}()
	select {
	case r := <-done:
		return r
	case <-time.After(d):
		t.Fatalf("the finisher's pass did not end within %v", d)
		return passResult{}
	}
}

// TestFinisherFinishesHealthyShardsBesideABlackholedOne: a shard that
// accepts connections and never answers does not keep a pass from
// finishing the abandoned calls of the other shard: each shard's listing
// has its bound. The store's lock timeout, which bounds its wait for a
// connection, is set to an hour, so that only the finisher's bound
// stands between the pass and the shard. Before, the pass waited for that
// shard as long as its context lasted: for ever, under Run.
func TestFinisherFinishesHealthyShardsBesideABlackholedOne(t *testing.T) {
	healthy := pgtest.NewPool(t)
	if _, err := healthy.Exec(context.Background(), `CREATE TABLE effects (id bigserial PRIMARY KEY, key text, value text)`); err != nil {
		t.Fatal(err)
	}
	dark, accepted := blackholePool(t)
	st := postgres.NewSharded([]*pgxpool.Pool{healthy, dark}, shardOf, postgres.WithLockTimeout(time.Hour))
	e := serveEnv(t, setup{opts: finishableOpts}, nil, st)
	finisher := newFinisherOn(t, e, st, &logBuffer{}, idem.WithInterval(2*time.Second))
	e.svc.setHook(crashFirstRun(nil))
	for _, key := range []string{"order-1", "order-2"} {
		_, err := e.client.Do(forTenant("alpha", key), &testv1.DoRequest{Value: "alpha"})
		wantCode(t, err, codes.Unknown)
	}

	r := finishWithin(t, t.Context(), finisher, 30*time.Second)
	if r.n != 2 {
		t.Fatalf("Finish = %d, %v; want alpha's 2 calls finished", r.n, r.err)
	}
	if r.err == nil || !strings.Contains(r.err.Error(), "shard 1") {
		t.Errorf("Finish's error = %v, want one that names shard 1", r.err)
	}
	if accepted() == 0 {
		t.Errorf("the pass never reached shard 1")
	}
	if k := countOn(t, healthy, `SELECT count(*) FROM idempotency_keys WHERE tenant = 'alpha' AND status = 'recorded'`); k != 2 {
		t.Errorf("%d of alpha's calls recorded, want 2", k)
	}
}

// TestFinisherBoundsEachAttempt: a call whose handler hangs (a provider
// that never answers) is cut off at the attempt's bound and left for a
// later pass; the pass goes on and finishes the other call. Before, the
// pass waited for the hung handler as long as its context lasted.
func TestFinisherBoundsEachAttempt(t *testing.T) {
	eachFinishableStoreWith(t, []idem.FinisherOption{idem.WithAttemptTimeout(time.Second)}, func(t *testing.T, c *finishable) {
		var cut atomic.Bool
		c.svc.setHook(crashFirstRun(func(ctx context.Context, key string) error {
			if key == "hung" {
				<-ctx.Done()
				cut.Store(true)
				return ctx.Err()
			}
			return nil
		}))
		abandon(t, c, "hung")
		abandon(t, c, "fine")

		r := finishWithin(t, t.Context(), c.finisher, 30*time.Second)
		if r.err != nil || r.n != 1 {
			t.Fatalf("Finish = %d, %v; want the call that does not hang finished", r.n, r.err)
		}
		if !cut.Load() {
			t.Error("the hung handler's context did not end")
		}
		var header metadata.MD
		if _, err := c.client.Do(forAcme("fine"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header)); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Errorf("retry of the finished call: %v (header %v), want a replay", err, header)
		}
		// The hung call is left for a later pass.
		list, err := c.store.(store.Finishing).Abandoned(t.Context(), 0, 10)
		if err != nil || len(list) != 1 || list[0].Scope.Key != "hung" {
			t.Errorf("Abandoned = %+v, %v; want the hung call", list, err)
		}
	})
}

// TestFinisherRecordsTheHandlersHeaders: a handler run by a finisher
// sets its response metadata with grpc.SetHeader and grpc.SetTrailer as on
// a call the server receives, and the caller's retry gets it replayed.
// Before, both failed for want of a server transport stream, and the
// metadata was lost.
func TestFinisherRecordsTheHandlersHeaders(t *testing.T) {
	eachFinishableStore(t, func(t *testing.T, c *finishable) {
		var setErr atomic.Value
		c.svc.setHook(crashFirstRun(func(ctx context.Context, _ string) error {
			err := errors.Join(
				grpc.SetHeader(ctx, metadata.Pairs("x-order-id", "o-9")),
				grpc.SetTrailer(ctx, metadata.Pairs("x-charge-id", "ch-1")))
			if err != nil {
				setErr.Store(err)
			}
			return nil
		}))
		abandon(t, c, "order-h")
		if n, err := c.finisher.Finish(t.Context()); err != nil || n != 1 {
			t.Fatalf("Finish = %d, %v", n, err)
		}
		if err := setErr.Load(); err != nil {
			t.Errorf("setting the response metadata in the finisher's run: %v", err)
		}
		var header, trailer metadata.MD
		if _, err := c.client.Do(forAcme("order-h"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(header.Get("x-order-id"), []string{"o-9"}) || len(header.Get(idem.ReplayedHeader)) != 1 ||
			!slices.Equal(trailer.Get("x-charge-id"), []string{"ch-1"}) {
			t.Errorf("the replay carries header %v and trailer %v; want the handler's x-order-id and x-charge-id", header, trailer)
		}
	})
}

// TestFinisherRunsItsInterceptors: the interceptors given to the
// finisher run around its calls in order, outside idem's, and what they
// put in the context (an identity, say) reaches the handler.
func TestFinisherRunsItsInterceptors(t *testing.T) {
	type userKey struct{}
	var (
		mu    sync.Mutex
		trace []string
	)
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		trace = append(trace, s)
	}
	outer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method, _ := grpc.Method(ctx)
		note("outer " + info.FullMethod + " " + method)
		return handler(context.WithValue(ctx, userKey{}, "u-7"), req)
	}
	inner := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		_, inLease := idem.KeyFromContext(ctx)
		note(fmt.Sprintf("inner (key already claimed: %v)", inLease))
		resp, err := handler(ctx, req)
		note("inner done: " + status.Code(err).String())
		return resp, err
	}
	c := newFinishable(t, true, nil, outer, inner)
	c.svc.setHook(crashFirstRun(func(ctx context.Context, _ string) error {
		user, _ := ctx.Value(userKey{}).(string)
		note("handler as " + user)
		return nil
	}))
	abandon(t, c, "order-i")
	if n, err := c.finisher.Finish(t.Context()); err != nil || n != 1 {
		t.Fatalf("Finish = %d, %v", n, err)
	}
	want := []string{"outer " + doMethod + " " + doMethod, "inner (key already claimed: false)", "handler as u-7", "inner done: OK"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(trace, want) {
		t.Errorf("the finisher's run went\n%q\nwant\n%q", trace, want)
	}
}
