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
)

// TestFinishersAndALateRetryRace has two finishers and the client's late
// retry meet on one abandoned checkout. Replica A dies after the charge
// step, and the client goes away. Replica B's finisher takes the checkout
// over and stalls inside the confirm step, after making the order: the
// test stops the process with SIGSTOP, as a long GC pause or a frozen VM
// would, and its lease runs out. The client comes back to replica C, is
// told the key is in use while B's lease runs, and retries when it has run
// out, racing C's finisher (grace 0): one of the two finishes the
// checkout, and the other is told the key is in use, or finds it done.
// When B wakes up (SIGCONT) its save of the step is refused by the fencing
// token: its outcome is lease_lost and nothing of it is recorded. One
// charge, one reservation, one order: the one B made, which the finisher
// found and kept.
func TestFinishersAndALateRetryRace(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	t.Parallel()
	s, ctx := newSystem(t)
	key := newKey()
	a, err := s.startReplica(ctx, "A", replicaConfig{crashAt: runnerCall + ":" + checkoutsvc.StepCharge, grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	defer a.stop()
	// B's finisher pauses inside the confirm step, so that the test
	// stops it there.
	b, err := s.startReplica(ctx, "B", replicaConfig{grace: 0, pause: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.stop()
	if _, _, err := checkout(ctx, a, key); status.Code(err) != codes.Unavailable {
		t.Fatalf("the checkout on the dying replica: %v, want UNAVAILABLE", err)
	}
	if err := a.wait(ctx); err == nil {
		t.Fatal("replica A exited cleanly, want it killed")
	}
	made, err := b.waitFor(ctx, func(e event) bool {
		return e.runner == runnerFinisher && e.key == key && e.point == checkoutsvc.PointOrderMade
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = b.cmd.Process.Signal(syscall.SIGCONT) // so that stop ends it
		}
	}()

	c, err := s.startReplica(ctx, "C", replicaConfig{grace: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	resp, header, first := checkout(ctx, c, key)
	var waited []time.Duration
	if status.Code(first) == codes.Aborted {
		resp, header, waited, err = retryWhileAborted(ctx, c, key, first)
	} else {
		err = first
	}
	if err != nil {
		t.Fatalf("the late retry: %v (first told %v, then waited %v)", err, first, waited)
	}
	if first != nil && errorReason(first) != idem.ReasonKeyInUse {
		t.Errorf("the late retry was first told %v, want ABORTED %s", first, idem.ReasonKeyInUse)
	}

	// The checkout is recorded: wake B up.
	if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed = true
	if _, err := b.waitFor(ctx, outcome(runnerFinisher, key, idem.ResultLeaseLost)); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*replica{b, c} {
		if err := r.stop(); err != nil {
			t.Errorf("replica %s: %v", r.name, err)
		}
	}

	for _, e := range b.events(key) {
		t.Logf("replica B: %v", e)
		if e.point == checkoutsvc.StepConfirm {
			t.Errorf("the stalled finisher saved its step after it woke up: %v", e)
		}
	}
	var runs []event
	executed := 0
	for _, e := range c.events(key) {
		t.Logf("replica C: %v", e)
		switch {
		case e.point == checkoutsvc.PointStarted:
			runs = append(runs, e)
		case e.point == pointOutcome && e.detail == string(idem.ResultExecuted):
			executed++
		case e.point == pointOutcome && e.detail != string(idem.ResultInUse) && e.detail != string(idem.ResultReplayed):
			t.Errorf("replica C: outcome %s, want executed, in_use or replayed", e.detail)
		}
	}
	t.Logf("the client was first told %v, then waited %v; replayed=%v", first, waited, replayed(header))
	if len(runs) != 1 || executed != 1 {
		t.Fatalf("replica C ran the checkout %d times (%v) and recorded it %d times, want one finisher", len(runs), runs, executed)
	}
	if clientFinished := runs[0].runner == runnerCall; replayed(header) == clientFinished {
		t.Errorf("the finisher was the %s, and the client's answer replayed=%v", runs[0].runner, replayed(header))
	}
	r, err := s.rows(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(r.once(1), r.answers(resp)...) {
		t.Error(f)
	}
	if r.orderID != made.detail {
		t.Errorf("the order is %s, want %s, the one the stalled finisher made", r.orderID, made.detail)
	}
	checkTotals(t, s, 1)
}
