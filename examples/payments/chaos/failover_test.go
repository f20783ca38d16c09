package chaos

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem/internal/pgtest"
)

// TestFailover fails PostgreSQL over while 16 clients drive 240 payments:
// the payments server reaches a primary and a streaming standby through one
// connection string (host=primary,standby target_session_attrs=read-write);
// midway the primary's processes are killed with SIGKILL, all at once, and
// the standby is promoted. The clients retry each payment under its key
// until it has an answer; then every payment is retried once more.
//
//   - synchronous: the standby is the primary's synchronous standby
//     (synchronous_standby_names = '*', synchronous_commit = on). No
//     acknowledged answer is lost, no payment happens twice, and every
//     retry after the failover gets its first answer, byte for byte.
//   - asynchronous: the standby streams on its own time. Acknowledged
//     answers the standby had not received are lost (the test logs how
//     many); each is lost together with its payment, never one without the
//     other, and its retry executes exactly once more. The others replay
//     byte for byte.
//   - asynchronous, standby behind: as asynchronous, but the standby stops
//     replicating a third of the way through, so the failover surely loses
//     the answers acknowledged since.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	for _, tc := range []struct {
		name        string
		synchronous bool
		detach      bool
	}{
		{"synchronous", true, false},
		{"asynchronous", false, false},
		{"asynchronous, standby behind", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testFailover(t, pgtest.ReplicationOptions{Synchronous: tc.synchronous}, tc.detach)
		})
	}
}

// failover kills r's primary and promotes its standby; it returns when the
// kill began, and how long after it the primary was gone and the standby
// accepted writes.
func failover(t *testing.T, r *pgtest.Replicated) (killed time.Time, gone, promoted time.Duration) {
	t.Helper()
	killed = time.Now()
	if err := r.KillPrimary(); err != nil {
		t.Fatalf("kill the primary: %v", err)
	}
	gone = time.Since(killed)
	if err := r.Promote(context.Background()); err != nil {
		t.Fatalf("promote the standby: %v", err)
	}
	return killed, gone, time.Since(killed)
}

func testFailover(t *testing.T, opts pgtest.ReplicationOptions, detach bool) {
	const (
		numOps     = 240
		numClients = 16
	)
	r, dsn := pgtest.NewReplicated(t, opts)
	srv := startServer(t, binary(t, serverPkg), dsn)
	pool := observerPool(t, dsn)
	dropBackstop(t, pool)
	pid := srv.pid()

	// First phase: each op until its first definitive answer, the one the
	// client acknowledges; the failover happens midway.
	l := &load{
		ops:           newOps(numOps, 10),
		conns:         clients(t, srv.addr, numClients),
		confirmations: 1,
	}
	var killed, detached time.Time
	var gone, promotion time.Duration
	if detach {
		l.faults = append(l.faults, func(int) {
			if err := r.DetachStandby(context.Background()); err != nil {
				t.Fatalf("detach the standby: %v", err)
			}
			detached = time.Now()
		})
	}
	l.faults = append(l.faults, func(int) {
		killed, gone, promotion = failover(t, r)
	})
	l.run(t)
	pool.Reset() // its connections died with the primary
	if !srv.running() || srv.pid() != pid {
		t.Errorf("the server process changed (%s); it must find the new primary on its own", srv.exitState())
	}
	l.checkCodes(t, codes.OK, codes.InvalidArgument, codes.Unavailable, codes.Aborted)
	checkStorageErrors(t, l, srv)
	t.Logf("failover: the primary was gone %v after the kill began, the standby accepted writes after %v; "+
		"the longest stretch without an answer to any client was %v",
		gone.Round(time.Millisecond), promotion.Round(time.Millisecond), longestSilence(l.ops).Round(time.Millisecond))

	// What the new primary holds, against what the clients were told.
	fc := checkFailedOver(t, pool, l.ops)
	ackedBeforeKill := 0
	for _, o := range l.ops {
		if o.err == nil && o.answers[0].at.Before(killed) {
			ackedBeforeKill++
		}
	}
	t.Logf("%d of %d acknowledged answers lost in the failover (%d had been acknowledged before the primary was killed)",
		len(fc.lost), len(l.ops), ackedBeforeKill)
	if detach {
		afterDetach := 0
		for _, o := range l.ops {
			if o.err == nil && o.answers[0].at.Before(killed) && o.answers[0].at.After(detached) {
				afterDetach++
			}
		}
		t.Logf("%d answers arrived between the standby's detach and the kill", afterDetach)
		// Some ops ran from start to end in that time (each client takes
		// the next op only when done with the last): their keys are lost.
		if len(fc.lost) == 0 {
			t.Errorf("no answer lost, with the standby detached while %d were acknowledged", afterDetach)
		}
	}
	if opts.Synchronous && len(fc.lost) > 0 {
		t.Errorf("%d acknowledged answers lost with a synchronous standby, want none", len(fc.lost))
	}

	// Second phase: every op once more, after the failover. A key the new
	// primary holds replays its first answer byte for byte; a lost key
	// runs again, once.
	l.confirmations = 2
	l.faults = nil
	l.run(t)
	checkRetried(t, pool, l.ops, fc.lost)
	if opts.Synchronous {
		checkInvariants(t, pool, l.ops)
	}
	l.checkCodes(t, codes.OK, codes.InvalidArgument)
}

// failedOver is what checkFailedOver found in the database after a
// failover.
type failedOver struct {
	// lost are the ops whose acknowledged answer the database no longer
	// holds: no key, and no payment.
	lost []*op
	// twice counts keys with more payments than their request allows
	// (more than one, or any for a request that failed validation);
	// disagree, keys whose row and payment were not kept together (one
	// without the other);
	// wrong, acknowledged answers that name another payment than the
	// database holds for their key. Each is also reported as a failure.
	twice, disagree, wrong int
}

// checkFailedOver compares what the database pool reaches holds after a
// failover with the first answer each client of ops accepted, and fails t
// for every key that breaks what atomic mode promises across any
// failover: the key and its effect commit together, so they survive or
// are lost together, and a key's payment is the one its first answer
// named.
func checkFailedOver(t *testing.T, pool *pgxpool.Pool, ops []*op) failedOver {
	t.Helper()
	db := snapshot(t, pool)
	var f failedOver
	fail := keyFailer(t)
	for _, o := range ops {
		if o.err != nil {
			fail(o, "%v", o.err)
			continue
		}
		first := o.answers[0]
		s := scope{o.tenant, o.key}
		k, present := db.keys[s]
		ids := db.payments[s]
		if present && k.status != "recorded" {
			fail(o, "key row %q, want recorded", k.status)
		}
		switch {
		case len(ids) > 1:
			f.twice++
			fail(o, "%d payments for one key", len(ids))
		case !present && len(ids) > 0:
			f.disagree++
			fail(o, "the key was lost but its payment %s survived", ids[0])
		case present && o.valid && len(ids) == 0:
			f.disagree++
			fail(o, "the key survived without its payment")
		case present && o.valid && (first.code != codes.OK || first.paymentID != ids[0]):
			f.wrong++
			fail(o, "acknowledged %v with payment %q, the new primary holds payment %s", first.code, first.paymentID, ids[0])
		case !o.valid && len(ids) > 0:
			f.twice++
			fail(o, "%d payments for a request that failed validation", len(ids))
		}
		if !present {
			f.lost = append(f.lost, o)
		}
	}
	return f
}

// checkRetried checks the ops after each was retried once more after a
// failover (a second answer each): a key the database holds replayed its
// first answer byte for byte, a lost key ran again, once, and every valid
// op has exactly one payment. It returns how many retries were answered
// wrongly: a lost key replayed, or a replay that differs from the first
// answer.
func checkRetried(t *testing.T, pool *pgxpool.Pool, ops, lost []*op) (wrongReplays int) {
	t.Helper()
	after := snapshot(t, pool)
	fail := keyFailer(t)
	valid := 0
	for _, o := range ops {
		if o.err != nil || len(o.answers) < 2 {
			fail(o, "no answer after the failover: %v", o.err)
			continue
		}
		first, again := o.answers[0], o.answers[1]
		s := scope{o.tenant, o.key}
		ids := after.payments[s]
		if k := after.keys[s]; k.status != "recorded" {
			fail(o, "key row %+v after the retry, want recorded", k)
		}
		if o.valid {
			valid++
			if len(ids) != 1 {
				fail(o, "%d payments after the retry, want exactly 1", len(ids))
				continue
			}
			if again.code != codes.OK || again.paymentID != ids[0] {
				fail(o, "the retry got %v with payment %q; the payment row is %s", again.code, again.paymentID, ids[0])
			}
		} else if len(ids) != 0 || again.code != codes.InvalidArgument {
			fail(o, "the retry got %v and left %d payments, want INVALID_ARGUMENT and none", again.code, len(ids))
		}
		if slices.Contains(lost, o) {
			if again.replayed {
				wrongReplays++
				fail(o, "the key was lost, yet its retry was a replay")
			}
			continue
		}
		if !again.replayed || !bytes.Equal(again.raw, first.raw) {
			wrongReplays++
			fail(o, "the retry after the failover got %x (replayed %v), the first answer was %x", again.raw, again.replayed, first.raw)
		}
	}
	if after.total != valid {
		t.Errorf("%d payments in all, want %d, one per valid op", after.total, valid)
	}
	if len(after.keys) != len(ops) {
		t.Errorf("%d idempotency keys, want %d", len(after.keys), len(ops))
	}
	return wrongReplays
}

// keyFailer returns a function that fails t for the key of one op, and
// stops t after ten such failures.
func keyFailer(t *testing.T) func(o *op, format string, args ...any) {
	failures := 0
	return func(o *op, format string, args ...any) {
		t.Helper()
		if failures++; failures > 10 {
			t.Fatalf("more failures not shown")
		}
		t.Errorf("key %s of %s: "+format, append([]any{o.key, o.tenant}, args...)...)
	}
}

// longestSilence returns the longest time between two consecutive
// definitive answers to any client of ops: how long the service looked
// down to its clients.
func longestSilence(ops []*op) time.Duration {
	var at []time.Time
	for _, o := range ops {
		for _, a := range o.answers {
			at = append(at, a.at)
		}
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	var longest time.Duration
	for i := 1; i < len(at); i++ {
		longest = max(longest, at[i].Sub(at[i-1]))
	}
	return longest
}
