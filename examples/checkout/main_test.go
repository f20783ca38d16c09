package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	"github.com/idemkit/idem/store/postgres/pgtest"
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
// Checkout and retries on a second replica. The retry sent at once is
// refused while the dead replica's lease runs; the retry after it resumes
// after the last saved step, and every side effect exists once: one charge
// at the provider, one reservation (and the stock taken once), one order,
// named by the answer, which a later retry gets replayed.
func TestCrashAndResume(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	for _, tc := range []struct {
		crashAt     string
		resumeAfter string
		chargeCalls int // Charge calls that reached the provider
	}{
		// The retry charges: the crashed attempt never did.
		{checkoutsvc.StepReserved, checkoutsvc.StepReserved, 1},
		// The provider charged but charge_sent was not saved: the retry
		// asks again under the same derived key and gets the charge
		// replayed.
		{checkoutsvc.PointChargeAnswered, checkoutsvc.StepReserved, 2},
		// Killed between charge_sent and charge_confirmed: the retry
		// confirms with the saved charge id and never calls the provider.
		{checkoutsvc.StepChargeSent, checkoutsvc.StepChargeSent, 1},
		// Killed before the answer was recorded: the retry only reads the
		// order back.
		{checkoutsvc.StepChargeConfirmed, checkoutsvc.StepChargeConfirmed, 1},
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
			if got := st.second[0]; got.point != checkoutsvc.PointStarted || got.detail != tc.resumeAfter {
				t.Errorf("the retry started with %v, want to resume after %q", got, tc.resumeAfter)
			}
			if r.charges != 1 || r.chargeCalls != tc.chargeCalls {
				t.Errorf("provider: %d charges after %d Charge calls, want 1 after %d", r.charges, r.chargeCalls, tc.chargeCalls)
			}
			if len(s.provider.Calls()) != tc.chargeCalls {
				t.Errorf("provider saw %d calls in all, want %d", len(s.provider.Calls()), tc.chargeCalls)
			}
			var charges int
			if err := s.providerDB.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges); err != nil || charges != 1 {
				t.Errorf("the provider holds %d charges in all (%v), want 1", charges, err)
			}
			if left, err := s.stock(ctx); err != nil || left != initialStock-quantity {
				t.Errorf("stock left = %d (%v), want %d", left, err, initialStock-quantity)
			}
		})
	}
}

// TestDemo runs the whole demo: run fails unless every invariant it checks
// held.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, &lockedWriter{w: testLog{t}}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"resume after charge_sent",
		"provider replayed charge ch_",
		"charges=2 reservations=2 orders=2 Charge calls=3; stock 10 -> 6",
		"every invariant held",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
