//go:build unix

package main

import (
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	checkoutv1 "github.com/idemkit/idem/examples/gen/checkout/v1"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestFailoverLostLease fails the checkout database over to a standby that
// is behind (asynchronous, and detached before the checkout began, so the
// new primary has no row for the key) while the checkout's handler is
// inside its confirm step: the order made, the step not yet saved. The
// test stops the replica there (SIGSTOP) for the failover and wakes it up
// after the promotion. The handler's next write under its fencing token
// matches no row: it has lost its lease (its outcome is lease_lost),
// records nothing, and its client is told ABORTED, IDEMPOTENCY_LEASE_LOST.
// The client's retry claims the key afresh and runs every step again: the
// reservation and the order are made again (they were lost with the key),
// and the charge step calls the provider again under the same derived key,
// which answers with the charge it already made: one charge in the world.
func TestFailoverLostLease(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	s, r, ctx := newReplicatedSystem(t, pgtest.ReplicationOptions{})
	if err := r.DetachStandby(ctx); err != nil {
		t.Fatal(err)
	}
	// The handler pauses inside the confirm step, so that the test stops
	// it there; the finisher's grace keeps it out of the way. Woken up,
	// it sleeps on for the rest of the pause, long enough for its lease's
	// heartbeat, once its pool has replaced the connections the failover
	// broke, to reach the new primary.
	rep, err := s.startReplica(ctx, "A", replicaConfig{grace: time.Minute, pause: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.stop()
	key := newKey()
	type answer struct {
		resp *checkoutv1.CheckoutResponse
		err  error
	}
	first := make(chan answer, 1)
	go func() {
		resp, _, err := checkout(ctx, rep, key)
		first <- answer{resp, err}
	}()
	if _, err := rep.waitFor(ctx, func(e event) bool {
		return e.runner == runnerCall && e.key == key && e.point == checkoutsvc.PointOrderMade
	}); err != nil {
		t.Fatal(err)
	}
	if err := rep.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = rep.cmd.Process.Signal(syscall.SIGCONT) // so that stop ends it
		}
	}()
	t.Logf("failover while the handler is in its confirm step: %s", failover(t, s, r))
	if err := rep.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed = true
	a := <-first

	if status.Code(a.err) != codes.Aborted || errorReason(a.err) != idem.ReasonLeaseLost {
		t.Fatalf("the handler whose key the failover lost answered %v, want ABORTED %s", a.err, idem.ReasonLeaseLost)
	}
	if _, err := rep.waitFor(ctx, outcome(runnerCall, key, idem.ResultLeaseLost)); err != nil {
		t.Fatalf("no lease_lost outcome: %v (events %v)", err, rep.events(key))
	}
	var leaseLost int
	again, wasReplay, err := checkoutUntilAnswered(ctx, rep, key, &leaseLost)
	if err != nil {
		t.Fatalf("the retry after the failover: %v", err)
	}
	for _, e := range rep.events(key) {
		t.Logf("replica A: %v", e)
	}
	rows, err := s.rows(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range rows.answers(again) {
		t.Error(w)
	}
	if wasReplay {
		t.Error("the retry of the lost key was a replay; want it to run afresh")
	}
	// Two Charge calls under the derived key, the second a replay of the
	// first: one charge.
	for _, w := range rows.once(2) {
		t.Error(w)
	}
	if rows.takeovers != 0 {
		t.Errorf("the key was taken over %d times; want a fresh claim on the new primary", rows.takeovers)
	}
	checkTotals(t, s, 1)
}
