package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fingerprint"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
)

const doMethod = testv1.TestService_Do_FullMethodName

func leasedEnv(t *testing.T, lease time.Duration, opts ...idem.Option) *env {
	return newEnv(t, setup{opts: append([]idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: lease})}, opts...)})
}

// wantRetryDelay returns the RetryInfo delay of an ABORTED answer.
func wantRetryDelay(t *testing.T, err error) time.Duration {
	t.Helper()
	wantCode(t, err, codes.Aborted)
	d := retryDelay(err)
	if d == nil {
		t.Fatalf("no RetryInfo in %v", err)
	}
	return *d
}

// reason returns the ErrorInfo reason of err, if any.
func reason(err error) string { return errorInfo(status.Convert(err)).GetReason() }

func TestLeasedRunsOnceAndReplays(t *testing.T) {
	e := leasedEnv(t, time.Minute)
	var sawTx bool
	e.svc.setHook(func(ctx context.Context, _ string) error {
		_, sawTx = postgres.TxFromContext(ctx)
		return nil
	})
	first, err := e.client.Do(withKey("k1"), &testv1.DoRequest{Value: "v"})
	if err != nil {
		t.Fatal(err)
	}
	if sawTx {
		t.Error("a leased handler was handed a transaction")
	}
	// The claim committed before the handler ran, so the handler's insert
	// (on the pool) is visible on its own; the key row is completed.
	if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded' AND locked_until IS NULL AND fencing_token IS NOT NULL`); got != 1 {
		t.Fatalf("completed leased rows = %d, want 1", got)
	}
	var header metadata.MD
	again, err := e.client.Do(withKey("k1"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, again) || header.Get(idem.ReplayedHeader)[0] != "true" {
		t.Fatalf("replay = %v (header %v), want %v", again, header, first)
	}
	if got := e.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	if _, err := e.client.Do(withKey("k1"), &testv1.DoRequest{Value: "other"}); reason(err) != idem.ReasonKeyReused {
		t.Fatalf("other request under the key: %v", err)
	}
}

func TestLeasedErrors(t *testing.T) {
	e := leasedEnv(t, time.Minute)
	fail := codes.Unavailable
	e.svc.setHook(func(context.Context, string) error { return status.Error(fail, "boom") })

	// Transient: the committed claim is deleted, so the retry runs.
	_, err := e.client.Do(withKey("t"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.Unavailable)
	if got := e.keys(t); got != 0 {
		t.Fatalf("key rows after a transient error = %d, want 0", got)
	}
	e.svc.setHook(nil)
	if _, err := e.client.Do(withKey("t"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatalf("retry after a transient error: %v", err)
	}

	// Deterministic: recorded and replayed without running again.
	fail = codes.InvalidArgument
	e.svc.setHook(func(context.Context, string) error { return status.Error(fail, "bad") })
	_, err = e.client.Do(withKey("d"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.InvalidArgument)
	e.svc.setHook(nil)
	_, err = e.client.Do(withKey("d"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.InvalidArgument)
	if got := e.countRows(t, `SELECT count(*) FROM effects WHERE key = 'd'`); got != 1 {
		t.Fatalf("executions of the failed request = %d, want 1", got)
	}
}

// TestLeasedLiveLease: a duplicate of a running call is told to come back
// when the lease runs out, and the heartbeat keeps a handler that runs far
// longer than its lease from being taken over.
func TestLeasedLiveLease(t *testing.T) {
	const lease = 600 * time.Millisecond
	st, beats := beating(func(pool *pgxpool.Pool) store.Store { return postgres.New(pool) })
	e := newEnv(t, setup{store: st, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: lease})}})
	release := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	e.svc.setHook(func(ctx context.Context, _ string) error {
		first := false
		once.Do(func() { first = true })
		if first { // only the first execution waits; a takeover would not
			close(started)
			<-release
		}
		return nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := e.client.Do(withKey("slow"), &testv1.DoRequest{Value: "v"})
		done <- err
	}()
	<-started
	if d := wantRetryDelay(t, callErr(e, "slow")); d <= 0 || d > lease {
		t.Fatalf("retry delay during a live lease = %v, want in (0, %v]", d, lease)
	}
	// Outlive the lease four times over: the heartbeat beats every third
	// of a lease at most, so twelve beats take four leases. Every duplicate
	// meanwhile is refused, none takes over.
	for beat := range int64(12) {
		idemtest.WaitFor(t, 10*time.Second, func() bool { return beats.beats.Load() > beat })
		if err := callErr(e, "slow"); status.Code(err) != codes.Aborted || reason(err) != idem.ReasonKeyInUse {
			t.Fatalf("duplicate while the heartbeat runs: %v", err)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the slow call: %v", err)
	}
	if got := e.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1 (a duplicate took the lease over)", got)
	}
	if err := callErr(e, "slow"); err != nil {
		t.Fatalf("replay after the slow call: %v", err)
	}
}

// beatingStore counts the lease extensions its leases were asked for (the
// heartbeat's, in the tests that use it), as each starts.
type beatingStore struct {
	store.Store
	beats atomic.Int64
}

func (s *beatingStore) ClaimLeased(ctx context.Context, key store.Scope, r store.LeaseRequest) (store.LeasedClaim, error) {
	c, err := s.Store.ClaimLeased(ctx, key, r)
	if c.Lease != nil {
		c.Lease = &beatingLease{Lease: c.Lease, s: s}
	}
	return c, err
}

type beatingLease struct {
	store.Lease
	s *beatingStore
}

func (l *beatingLease) Extend(ctx context.Context, d time.Duration) error {
	l.s.beats.Add(1)
	return l.Lease.Extend(ctx, d)
}

// beating returns a setup.store that builds st on the test's database
// wrapped in a beatingStore, which it also returns.
func beating(st func(*pgxpool.Pool) store.Store) (func(*pgxpool.Pool) store.Store, *beatingStore) {
	b := &beatingStore{}
	return func(pool *pgxpool.Pool) store.Store {
		b.Store = st(pool)
		return b
	}, b
}

func callErr(e *env, key string) error {
	_, err := e.client.Do(withKey(key), &testv1.DoRequest{Value: "v"})
	return err
}

// abandonedClaim writes the row a crashed leased worker leaves behind: in
// progress, its lease run out, with the step charge_sent saved (result
// ch_42).
func abandonedClaim(t *testing.T, e *env, key, value string) {
	t.Helper()
	fp, err := fingerprint.Sum(&testv1.DoRequest{Value: value})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.pool.Exec(context.Background(), `INSERT INTO idempotency_keys
		(id, tenant, method, key, request_hash, expires_at, locked_until, fencing_token, step_names, step_results)
		VALUES (`+pgtest.KeyIDSQL("''", "$1::text", "$2::text")+`, '', $1, $2, $3,
			now() + interval '1 hour', now() - interval '1 second', 7, '{charge_sent}', '{ch_42}')`,
		doMethod, key, fp)
	if err != nil {
		t.Fatal(err)
	}
}

func TestLeasedTakeoverResumes(t *testing.T) {
	e := leasedEnv(t, time.Minute)
	abandonedClaim(t, e, "crashed", "v")
	var (
		data    string
		charged bool
	)
	e.svc.setHook(func(ctx context.Context, _ string) error {
		d, err := idem.Step(ctx, "charge_sent", func(context.Context) ([]byte, error) {
			charged = true
			return []byte("ch_new"), nil
		})
		if err != nil {
			return err
		}
		data = string(d)
		_, err = idem.Step(ctx, "charge_confirmed", func(context.Context) ([]byte, error) { return nil, nil })
		return err
	})
	if _, err := e.client.Do(withKey("crashed"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if charged || data != "ch_42" {
		t.Fatalf("resumed with charge_sent = %q (run again: %v), want the saved ch_42", data, charged)
	}
	if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded' AND fencing_token <> 7 AND step_names = '{charge_sent,charge_confirmed}'`); got != 1 {
		t.Fatal("the takeover did not record the key under a new fencing token")
	}
}

func TestLeasedNoTakeoverWithAnotherRequest(t *testing.T) {
	e := leasedEnv(t, time.Minute)
	abandonedClaim(t, e, "crashed", "v")
	_, err := e.client.Do(withKey("crashed"), &testv1.DoRequest{Value: "different"})
	if status.Code(err) != codes.FailedPrecondition || reason(err) != idem.ReasonKeyReused {
		t.Fatalf("another request under an abandoned key: %v", err)
	}
	if e.svc.count() != 0 {
		t.Fatal("the handler ran")
	}
	if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress' AND fencing_token = 7`); got != 1 {
		t.Fatal("the abandoned claim changed")
	}
}

// TestLeasedStaleWorker: a worker whose key was taken over can neither
// record its outcome nor delete the new owner's claim; its caller gets
// ABORTED with reason IDEMPOTENCY_LEASE_LOST.
func TestLeasedStaleWorker(t *testing.T) {
	for _, outcome := range []struct {
		name string
		err  error
	}{{"ok", nil}, {"deterministic", status.Error(codes.NotFound, "gone")}, {"transient", status.Error(codes.Unavailable, "blip")}} {
		t.Run(outcome.name, func(t *testing.T) {
			e := leasedEnv(t, time.Minute)
			e.svc.setHook(func(ctx context.Context, _ string) error {
				// Another request takes the key over while this one runs.
				_, err := e.pool.Exec(ctx, `UPDATE idempotency_keys SET fencing_token = fencing_token + 1`)
				if err != nil {
					return err
				}
				return outcome.err
			})
			_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
			if outcome.err != nil && !isTransient(outcome.err) {
				if status.Code(err) != codes.Aborted || reason(err) != idem.ReasonLeaseLost {
					t.Fatalf("stale worker's answer: %v", err)
				}
			}
			if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress' AND response IS NULL`); got != 1 {
				t.Fatal("the stale worker changed the new owner's claim")
			}
		})
	}
}

// isTransient reports whether idem's default classifier counts err as
// transient: every code but INVALID_ARGUMENT, FAILED_PRECONDITION,
// OUT_OF_RANGE, ALREADY_EXISTS and NOT_FOUND.
func isTransient(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.AlreadyExists, codes.NotFound:
		return false
	}
	return true
}

// TestLeasedHeartbeatNoticesTakeover: the heartbeat learns that the lease is
// lost and cancels the handler's context.
func TestLeasedHeartbeatNoticesTakeover(t *testing.T) {
	e := leasedEnv(t, 300*time.Millisecond)
	var cause error
	e.svc.setHook(func(ctx context.Context, _ string) error {
		if _, err := e.pool.Exec(ctx, `UPDATE idempotency_keys SET fencing_token = fencing_token + 1`); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return nil
		}
	})
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	if status.Code(err) != codes.Aborted || reason(err) != idem.ReasonLeaseLost {
		t.Fatalf("answer: %v", err)
	}
	if !errors.Is(cause, store.ErrLeaseLost) {
		t.Fatalf("handler's context ended with %v, want ErrLeaseLost", cause)
	}
}

func TestStepsNeedLeasedMode(t *testing.T) {
	e := newEnv(t, setup{})
	var stepErr error
	var ran bool
	e.svc.setHook(func(ctx context.Context, _ string) error {
		_, stepErr = idem.Step(ctx, "step", func(context.Context) ([]byte, error) {
			ran = true
			return nil, nil
		})
		return nil
	})
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(stepErr, idem.ErrNotLeased) || ran {
		t.Fatalf("in atomic mode: step = %v, ran = %v", stepErr, ran)
	}
}

// TestLeasedTransientErrorKeepsSteps: a transient error after a step ends
// the lease instead of deleting the claim, so the retry resumes rather than
// repeating the steps already done.
func TestLeasedTransientErrorKeepsSteps(t *testing.T) {
	e := leasedEnv(t, time.Minute)
	var (
		resumed string
		charges int
	)
	first := true
	e.svc.setHook(func(ctx context.Context, _ string) error {
		d, err := idem.Step(ctx, "charge_sent", func(context.Context) ([]byte, error) {
			charges++
			return []byte("ch_1"), nil
		})
		if err != nil {
			return err
		}
		if first {
			first = false
			return status.Error(codes.Unavailable, "blip after the charge")
		}
		resumed = string(d)
		return nil
	})
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.Unavailable)
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if resumed != "ch_1" || charges != 1 {
		t.Fatalf("resumed with charge_sent = %q after %d charges, want ch_1 after one", resumed, charges)
	}
}

// TestLeasedHeartbeatAfterRecord: a heartbeat that fires as the outcome is
// recorded must not turn a recorded call into a lost lease. The lease is so
// short that the heartbeat beats every millisecond.
func TestLeasedHeartbeatAfterRecord(t *testing.T) {
	st, beats := beating(func(pool *pgxpool.Pool) store.Store { return postgres.New(pool) })
	e := newEnv(t, setup{store: st, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: 3 * time.Millisecond})}})
	e.svc.setHook(func(context.Context, string) error {
		// Let the heartbeat beat.
		before := beats.beats.Load()
		if !idemtest.Eventually(10*time.Second, func() bool { return beats.beats.Load() > before }) {
			return status.Error(codes.Internal, "the heartbeat never beat")
		}
		return nil
	})
	for i := range 150 {
		key := fmt.Sprintf("k%d", i)
		if _, err := e.client.Do(withKey(key), &testv1.DoRequest{Value: "v"}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded'`); got != 150 {
		t.Fatalf("completed keys = %d, want 150", got)
	}
}

// leaseStores are the stores the leased tests below run on. Either way the
// handler's side effects are rows of the test database's effects table.
var leaseStores = []struct {
	name string
	new  func(pool *pgxpool.Pool) store.Store
}{
	{"postgres", func(pool *pgxpool.Pool) store.Store { return postgres.New(pool) }},
	{"memory", func(*pgxpool.Pool) store.Store { return memory.New() }},
}

// settle calls Do with key until the answer is no longer ABORTED
// IDEMPOTENCY_KEY_IN_USE (the first call is still running or recording),
// for at most 10 s, and returns the answer and its header.
func settle(t *testing.T, e *env, key string) (*testv1.DoResponse, metadata.MD, error) {
	t.Helper()
	var (
		resp   *testv1.DoResponse
		header metadata.MD
		err    error
	)
	if !idemtest.Eventually(10*time.Second, func() bool {
		header = nil
		resp, err = e.client.Do(withKey(key), &testv1.DoRequest{Value: "v"}, grpc.Header(&header))
		return status.Code(err) != codes.Aborted || reason(err) != idem.ReasonKeyInUse
	}) {
		t.Fatalf("key %q still in use after 10 s: %v", key, err)
	}
	return resp, header, err
}

// TestLeasedRecordsAfterClientDeadline: a leased handler that ignores its
// client's deadline and finishes its side effect afterwards has its outcome
// recorded, so the retry replays it instead of running the side effect
// again.
func TestLeasedRecordsAfterClientDeadline(t *testing.T) {
	for _, st := range leaseStores {
		t.Run(st.name, func(t *testing.T) {
			e := newEnv(t, setup{store: st.new, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute})}})
			var calls, charges atomic.Int32
			clientGone := make(chan struct{})
			e.svc.setHook(func(ctx context.Context, _ string) error {
				if calls.Add(1) == 1 {
					<-ctx.Done() // the client's deadline passes
					// The server's deadline, sent as grpc-timeout, can
					// pass just before the client's: answer only once
					// the client has given up.
					<-clientGone
				}
				charges.Add(1) // the side effect, finished regardless
				return nil
			})
			ctx, cancel := context.WithTimeout(withKey("late"), 300*time.Millisecond)
			defer cancel()
			_, err := e.client.Do(ctx, &testv1.DoRequest{Value: "v"})
			close(clientGone)
			wantCode(t, err, codes.DeadlineExceeded)

			_, header, err := settle(t, e, "late")
			if err != nil {
				t.Fatalf("retry after the deadline: %v", err)
			}
			if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
				t.Errorf("retry after the deadline was not a replay (header %v)", header)
			}
			if got := charges.Load(); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
			if got := e.effects(t); got != 1 {
				t.Errorf("effects = %d, want 1", got)
			}
			if st.name == "postgres" {
				if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded'`); got != 1 {
					t.Errorf("completed key rows = %d, want 1", got)
				}
			}
		})
	}
}

// TestLeasedHeartbeatOutlivesClient: the lease is extended while the
// handler runs, not while its client waits. A handler that runs on for four
// times its lease after its client went away keeps its key: a retry
// meanwhile is refused instead of running the side effect a second time,
// and once the handler returns its outcome is recorded and replayed.
func TestLeasedHeartbeatOutlivesClient(t *testing.T) {
	const lease = 600 * time.Millisecond
	for _, st := range leaseStores {
		t.Run(st.name, func(t *testing.T) {
			newStore, beats := beating(st.new)
			e := newEnv(t, setup{store: newStore, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: lease})}})
			started, gone, finish := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var finishOnce sync.Once
			finishHandler := func() { finishOnce.Do(func() { close(finish) }) }
			t.Cleanup(finishHandler)
			var calls atomic.Int32
			e.svc.setHook(func(ctx context.Context, _ string) error {
				if calls.Add(1) == 1 {
					close(started)
					<-ctx.Done() // the client went away
					close(gone)
					<-finish // the handler runs on
				}
				return nil
			})
			ctx, cancel := context.WithCancel(withKey("slow"))
			errc := make(chan error, 1)
			go func() {
				_, err := e.client.Do(ctx, &testv1.DoRequest{Value: "v"})
				errc <- err
			}()
			<-started
			cancel()
			wantCode(t, <-errc, codes.Canceled)
			<-gone

			// Four leases: the heartbeat beats every third of a lease
			// at most, so twelve beats after the client went away
			// take four leases.
			from := beats.beats.Load()
			for beat := range int64(12) {
				idemtest.WaitFor(t, 10*time.Second, func() bool { return beats.beats.Load() > from+beat })
				if err := callErr(e, "slow"); status.Code(err) != codes.Aborted || reason(err) != idem.ReasonKeyInUse {
					t.Fatalf("retry while the handler runs without its client: %v, want ABORTED %s", err, idem.ReasonKeyInUse)
				}
			}
			if got := calls.Load(); got != 1 {
				t.Fatalf("executions = %d, want 1", got)
			}
			finishHandler()
			if _, header, err := settle(t, e, "slow"); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
				t.Fatalf("retry after the handler returned: %v (header %v), want a replay", err, header)
			}
			if got := e.effects(t); got != 1 {
				t.Fatalf("effects = %d, want 1", got)
			}
		})
	}
}

// failingRecord is a store whose first leased Record fails without
// recording anything, as a lost connection would.
type failingRecord struct {
	store.Store
	failed atomic.Bool
}

func (s *failingRecord) ClaimLeased(ctx context.Context, key store.Scope, r store.LeaseRequest) (store.LeasedClaim, error) {
	c, err := s.Store.ClaimLeased(ctx, key, r)
	if c.Lease != nil {
		c.Lease = &failingLease{Lease: c.Lease, s: s}
	}
	return c, err
}

type failingLease struct {
	store.Lease
	s *failingRecord
}

func (l *failingLease) Record(ctx context.Context, out store.Outcome) error {
	if l.s.failed.CompareAndSwap(false, true) {
		return errors.New("write tcp 10.0.0.1:5432: connection reset by peer")
	}
	return l.Lease.Record(ctx, out)
}

// TestLeasedFailedRecordKeepsClaim: when recording the outcome of a handler
// that succeeded (or failed deterministically) fails, the claim is not
// deleted, so that a retry cannot run the side effect again at once: the
// caller gets UNAVAILABLE, a retry is refused while the lease runs, and
// once the lease has run out a retry takes the call over.
func TestLeasedFailedRecordKeepsClaim(t *testing.T) {
	const lease = 2 * time.Second
	for _, st := range leaseStores {
		for _, outcome := range []struct {
			name string
			err  error
		}{{"ok", nil}, {"deterministic", status.Error(codes.NotFound, "gone")}} {
			t.Run(st.name+"/"+outcome.name, func(t *testing.T) {
				clock := &testClock{}
				newStore := st.new
				if st.name == "memory" {
					newStore = func(*pgxpool.Pool) store.Store { return memory.New(memory.WithClock(clock.now)) }
				}
				e := newEnv(t, setup{
					store: func(pool *pgxpool.Pool) store.Store { return &failingRecord{Store: newStore(pool)} },
					opts:  []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: lease})},
				})
				e.svc.setHook(func(context.Context, string) error { return outcome.err })
				_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
				unavailable := wantCode(t, err, codes.Unavailable)

				// The claim stays in progress.
				if st.name == "postgres" {
					if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'`); got != 1 {
						t.Fatalf("in-progress key rows after a failed record = %d, want 1", got)
					}
				}
				if err := callErr(e, "k"); status.Code(err) != codes.Aborted || reason(err) != idem.ReasonKeyInUse {
					t.Fatalf("retry while the lease runs: %v, want ABORTED %s", err, idem.ReasonKeyInUse)
				}
				if got := e.effects(t); got != 1 {
					t.Fatalf("effects = %d, want 1", got)
				}

				// Once the lease has run out, by the database's clock or
				// by store/memory's moved past it, a retry takes the call
				// over.
				if st.name == "postgres" {
					idemtest.WaitFor(t, 10*time.Second, func() bool {
						return e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress' AND locked_until < now()`) == 1
					})
				} else {
					clock.advance(lease + time.Millisecond)
				}
				err = callErr(e, "k")
				if status.Code(err) != status.Code(outcome.err) {
					t.Fatalf("retry after the lease ran out: %v, want %v", err, outcome.err)
				}
				if got := e.effects(t); got != 2 {
					t.Fatalf("effects = %d, want 2 (the takeover ran the handler)", got)
				}
				if st.name == "postgres" {
					if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded'`); got != 1 {
						t.Fatalf("completed key rows after the takeover = %d, want 1", got)
					}
				}
				if strings.Contains(unavailable.Message(), "connection reset") {
					t.Errorf("the caller saw the storage error: %q", unavailable.Message())
				}
			})
		}
	}
}

// TestStepRefusesInvalidPoint: a step name or result that no store can
// keep is refused with store.ErrInvalidStep on every store, and
// nothing is saved.
func TestStepRefusesInvalidPoint(t *testing.T) {
	invalid := map[string]store.Step{
		"NUL":              {Name: "charge\x00sent"},
		"invalid UTF-8":    {Name: "charge\xffsent"},
		"256-byte step":    {Name: strings.Repeat("s", store.MaxStepLength+1)},
		"data past 64 KiB": {Name: "charge_sent", Result: make([]byte, store.MaxStepResultBytes+1)},
	}
	for _, st := range leaseStores {
		t.Run(st.name, func(t *testing.T) {
			e := newEnv(t, setup{store: st.new, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute})}})
			var (
				mu    sync.Mutex
				errs  = map[string]error{}
				saved bool
			)
			e.svc.setHook(func(ctx context.Context, _ string) error {
				mu.Lock()
				defer mu.Unlock()
				for name, p := range invalid {
					_, errs[name] = idem.Step(ctx, p.Name, func(context.Context) ([]byte, error) { return p.Result, nil })
				}
				// Had the step been saved, Step would return its result
				// without running fn.
				_, err := idem.Step(ctx, "charge_sent", func(context.Context) ([]byte, error) {
					return nil, errors.New("not saved")
				})
				saved = err == nil
				return nil
			})
			if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			for name, err := range errs {
				if !errors.Is(err, store.ErrInvalidStep) {
					t.Errorf("Step with %s: %v, want store.ErrInvalidStep", name, err)
				}
			}
			if saved {
				t.Error("the lease holds a step after invalid ones only")
			}
			if st.name == "postgres" {
				if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded' AND step_names IS NULL AND step_results IS NULL`); got != 1 {
					t.Errorf("recorded key rows without a step = %d, want 1", got)
				}
			}
		})
	}
}
