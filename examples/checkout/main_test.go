package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestMain serves CheckoutService instead of running the tests when the
// test binary is started as a replica.
func TestMain(m *testing.M) {
	if isReplica() {
		if err := serveReplica(); err != nil {
			fmt.Fprintln(os.Stderr, "replica:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(pgtest.Run(m))
}

// testLog writes a replica's standard error to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func newSystem(t *testing.T) (*system, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	s, err := startSystem(ctx, pgtest.NewDatabase(t), pgtest.NewPool(t), &lockedWriter{w: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s, ctx
}

// TestCrashAndResume kills a checkout replica with SIGKILL at each point of
// Checkout and has the client retry on a second replica. The retry sent at
// once is refused while the dead replica's lease runs; the retry after it
// takes the key over, skips the steps the dead attempt saved, and every
// side effect exists once: one charge at the provider, one reservation
// (and the stock taken once), one order, named by the answer, which a
// later retry gets replayed. The second replica's finisher, whose grace
// outlasts the retry, does not step in.
func TestCrashAndResume(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	for _, tc := range []struct {
		crashAt     string
		chargeCalls int // Charge calls that reached the provider
	}{
		// The retry charges: the crashed attempt never did.
		{checkoutsvc.StepReserve, 1},
		// The provider charged but the charge step was not saved: the
		// retry asks again under the same derived key and gets the charge
		// replayed.
		{checkoutsvc.PointChargeAnswered, 2},
		// Killed after the charge step: the retry confirms with the saved
		// charge id and never calls the provider.
		{checkoutsvc.StepCharge, 1},
		// Killed before the answer was recorded: the retry runs no step.
		{checkoutsvc.StepConfirm, 1},
	} {
		t.Run("crash at "+tc.crashAt, func(t *testing.T) {
			t.Parallel()
			s, ctx := newSystem(t)
			st, err := s.play(ctx, tc.crashAt)
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.rows(ctx, st.key)
			if err != nil {
				t.Fatal(err)
			}
			var story bytes.Buffer
			tell(&story, st, r)
			t.Log(story.String())

			for _, f := range st.broken(r) {
				t.Error(f)
			}
			if len(s.provider.Calls()) != tc.chargeCalls {
				t.Errorf("provider saw %d calls in all, want %d", len(s.provider.Calls()), tc.chargeCalls)
			}
			checkTotals(t, s, 1)
		})
	}
}

// checkTotals checks that the system holds n checkouts, each once.
func checkTotals(t *testing.T, s *system, n int) {
	t.Helper()
	got, err := s.totals(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got.charges != n || got.reservations != n || got.orders != n || got.stock != initialStock-n*quantity {
		t.Errorf("in all: %d charges, %d reservations, %d orders and %d left in stock; want %d, %d, %d and %d",
			got.charges, got.reservations, got.orders, got.stock, n, n, n, initialStock-n*quantity)
	}
}

// grace is the finishers' grace in the tests of finishing: shorter than
// the demo's, so that they wait less.
const grace = 300 * time.Millisecond

// TestAbandonedCheckoutIsFinished kills the replica running a checkout
// after its charge step; the client never retries. The finisher of a
// second replica takes the checkout over once the lease and the grace have
// run out, resumes after the charge (the provider is not asked again) and
// records the outcome: one charge, one reservation, one order, the key
// recorded and its request dropped. The client's retry a day later, on a
// replica started since, gets the answer replayed.
func TestAbandonedCheckoutIsFinished(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	t.Parallel()
	s, ctx := newSystem(t)
	ab, err := s.abandon(ctx, checkoutsvc.StepCharge, grace)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.rows(ctx, ab.key)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range ab.broken(r) {
		t.Error(f)
	}
	if r.takeovers != 1 {
		t.Errorf("the key was taken over %d times, want once, by the finisher", r.takeovers)
	}

	// "A day later": the retry comes seconds later in wall time. idem
	// tells a live key from an expired one by comparing its expires_at
	// with the database's now(), so the key's TTL (24 h, the default) is
	// what lets a client come back a day later: the key must have nearly
	// all of it left, and moving its timestamps a day minus a minute into
	// the past is what the passing day looks like to idem. (A day and a
	// minute would find the key expired and run the checkout afresh; its
	// rows, unique by the key, and the provider's own key would still
	// keep it from charging twice, but that is not what this test shows.)
	const day = 24 * time.Hour
	if r.expiresIn < day-time.Minute {
		t.Fatalf("the recorded key expires in %v, want the 24 h TTL", r.expiresIn)
	}
	if _, err := s.checkoutDB.Exec(ctx, `UPDATE idempotency_keys
		SET created_at = created_at - $2::interval, updated_at = updated_at - $2::interval, expires_at = expires_at - $2::interval
		WHERE key = $1`, ab.key, (day - time.Minute).String()); err != nil {
		t.Fatal(err)
	}
	late, err := s.retryLater(ctx, ab.key)
	if err != nil {
		t.Fatal(err)
	}
	after, err := s.rows(ctx, ab.key)
	if err != nil {
		t.Fatal(err)
	}
	if after.expiresIn <= 0 || after.expiresIn > time.Minute {
		t.Errorf("the aged key expires in %v, want within a minute", after.expiresIn)
	}
	for _, f := range late.broken(after) {
		t.Error(f)
	}
	for _, f := range after.once(1) {
		t.Error("after the late retry: " + f)
	}
	checkTotals(t, s, 1)
}

// TestFinisherRecordsADeterministicError abandons a checkout as soon as
// its handler started; while it is abandoned the stock runs out. The
// finisher takes it over and the reserve step fails with
// FAILED_PRECONDITION, which is recorded once, as the key's outcome:
// nothing is reserved, charged or ordered, the request is dropped, and the
// client's late retry gets the error replayed without running anything.
func TestFinisherRecordsADeterministicError(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	t.Parallel()
	s, ctx := newSystem(t)
	key := newKey()
	a, err := s.startReplica(ctx, "A", replicaConfig{crashAt: runnerCall + ":" + checkoutsvc.PointStarted, grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	defer a.stop()
	b, err := s.startReplica(ctx, "B", replicaConfig{grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	defer b.stop()
	if _, _, err := checkout(ctx, a, key); status.Code(err) != codes.Unavailable {
		t.Fatalf("the checkout on the dying replica: %v, want UNAVAILABLE", err)
	}
	// The last item sold elsewhere while the checkout was abandoned.
	if _, err := s.checkoutDB.Exec(ctx, `UPDATE stock SET available = 1 WHERE sku = $1`, sku); err != nil {
		t.Fatal(err)
	}
	if _, err := b.waitFor(ctx, outcome(runnerFinisher, key, idem.ResultExecuted)); err != nil {
		t.Fatal(err)
	}
	_, header, lateErr := checkout(ctx, b, key)
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}

	want := []event{
		{runnerFinisher, key, checkoutsvc.PointStarted, ""},
		{runnerFinisher, key, pointOutcome, string(idem.ResultExecuted)},
		{runnerCall, key, pointOutcome, string(idem.ResultReplayed)},
	}
	if got := b.events(key); !slices.Equal(got, want) {
		t.Errorf("replica B reported %v, want %v", got, want)
	}
	if st, _ := status.FromError(lateErr); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "in stock") || !replayed(header) {
		t.Errorf("the late retry got %v (replayed=%v), want the recorded FAILED_PRECONDITION replayed", lateErr, replayed(header))
	}
	r, err := s.rows(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if r.keyStatus != "recorded" || r.responseCode != int(codes.FailedPrecondition) || r.requestKept {
		t.Errorf("the key is %q with code %d, request kept=%v; want recorded with FAILED_PRECONDITION, the request dropped",
			r.keyStatus, r.responseCode, r.requestKept)
	}
	if r.reservations != 0 || r.charges != 0 || r.chargeCalls != 0 || r.orders != 0 {
		t.Errorf("%d reservations, %d charges (%d calls), %d orders; want none", r.reservations, r.charges, r.chargeCalls, r.orders)
	}
	if t2, err := s.totals(ctx); err != nil || t2.stock != 1 {
		t.Errorf("stock left = %d (%v), want the 1 left untouched", t2.stock, err)
	}
}

// TestFinisherKilledMidStep abandons five checkouts, each on a replica
// killed at another point, and then, five times over, starts a replica
// whose finisher takes an abandoned checkout over and is killed inside
// the step it runs: after the reservation is made, after the provider
// answered, or after the order is made, before the step is saved. A last
// replica's finisher then finishes every one of them: each checkout has
// one reservation, one charge and one order, its key is completed with its
// request dropped, and the stock is taken once per checkout.
func TestFinisherKilledMidStep(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	t.Parallel()
	s, ctx := newSystem(t)
	crashes := []string{ // where each checkout's own call dies
		checkoutsvc.StepReserve,
		checkoutsvc.PointChargeAnswered,
		checkoutsvc.StepCharge,
		checkoutsvc.PointReservationMade,
		checkoutsvc.PointOrderMade,
	}
	keys := make([]string, len(crashes))
	var (
		mu  sync.Mutex
		all []event // what every replica reported
	)
	record := func(r *replica) {
		mu.Lock()
		defer mu.Unlock()
		all = append(all, r.events("")...)
	}
	var wg sync.WaitGroup
	for i, crashAt := range crashes {
		keys[i] = newKey()
		wg.Go(func() {
			// Its finisher waits a minute: only the replicas below
			// complete checkouts.
			a, err := s.startReplica(ctx, fmt.Sprint("A", i), replicaConfig{crashAt: runnerCall + ":" + crashAt, grace: time.Minute})
			if err != nil {
				t.Error(err)
				return
			}
			defer a.stop()
			if _, _, err := checkout(ctx, a, keys[i]); status.Code(err) != codes.Unavailable {
				t.Errorf("the checkout on replica A%d, killed at %s: %v, want UNAVAILABLE", i, crashAt, err)
			}
			if err := a.wait(ctx); err == nil {
				t.Errorf("replica A%d exited cleanly, want it killed", i)
			}
			record(a)
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	midStep := []string{checkoutsvc.PointReservationMade, checkoutsvc.PointChargeAnswered, checkoutsvc.PointOrderMade}
	var crashAt []string
	for _, p := range midStep {
		crashAt = append(crashAt, runnerFinisher+":"+p)
	}
	for round := range len(keys) {
		c, err := s.startReplica(ctx, fmt.Sprint("C", round), replicaConfig{crashAt: strings.Join(crashAt, ","), grace: grace})
		if err != nil {
			t.Fatal(err)
		}
		err = c.wait(ctx)
		record(c)
		log := c.events("")
		if err == nil || len(log) == 0 {
			t.Fatalf("round %d: the finisher's replica ended with %v after %v, want it killed", round, err, log)
		}
		last := log[len(log)-1]
		if last.runner != runnerFinisher || !slices.Contains(midStep, last.point) || !slices.Contains(keys, last.key) {
			t.Fatalf("round %d: the replica died at %v, want inside a step of an abandoned checkout run by its finisher", round, last)
		}
		t.Logf("round %d: killed at %s of checkout %d", round, last.point, slices.Index(keys, last.key))
	}

	survivor, err := s.startReplica(ctx, "S", replicaConfig{grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	defer survivor.stop()
	for _, key := range keys {
		if _, err := survivor.waitFor(ctx, outcome(runnerFinisher, key, idem.ResultExecuted)); err != nil {
			t.Fatal(err)
		}
	}
	if err := survivor.stop(); err != nil {
		t.Fatal(err)
	}
	record(survivor)
	for i, key := range keys {
		r, err := s.rows(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		// Every provider answer was reported before any kill, so the
		// provider was asked as often as answers were reported: once, and
		// again, replayed, after each kill inside the charge step.
		answers := 0
		for _, e := range all {
			if e.key == key && e.point == checkoutsvc.PointChargeAnswered {
				if replayed := strings.HasSuffix(e.detail, checkoutsvc.Replayed); replayed != (answers > 0) {
					t.Errorf("checkout %d: provider answer %d was %q", i, answers, e.detail)
				}
				answers++
			}
		}
		for _, f := range r.once(answers) {
			t.Errorf("checkout %d (killed at %s): %s", i, crashes[i], f)
		}
		if r.takeovers < 2 {
			t.Errorf("checkout %d was taken over %d times, want by a killed finisher and the last one", i, r.takeovers)
		}
		var outcomes []string
		for _, e := range survivor.events(key) {
			if e.point == pointOutcome {
				outcomes = append(outcomes, e.runner+" "+e.detail)
			}
		}
		if !slices.Equal(outcomes, []string{runnerFinisher + " " + string(idem.ResultExecuted)}) {
			t.Errorf("checkout %d: the last replica's outcomes %v, want its finisher's, executed, once", i, outcomes)
		}
	}
	checkTotals(t, s, len(keys))
}

// TestDemo runs the whole demo: run fails unless every invariant it checks
// held.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, &lockedWriter{w: testLog{t}}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	for _, want := range []string{
		"provider replayed charge ch_",
		"client: gives up",
		"takes the abandoned checkout over",
		"charges=2 reservations=2 orders=2 Charge calls=3; stock 10 -> 6",
		"every invariant held",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
