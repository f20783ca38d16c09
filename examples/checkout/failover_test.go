package main

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	checkoutv1 "github.com/idemkit/idem/examples/gen/checkout/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/internal/pgtest"
)

// newReplicatedSystem is newSystem with the checkout database on a primary
// and a streaming standby, reached by a multi-host connection string
// (target_session_attrs=read-write). The provider's database, the world
// outside, is on another server and does not fail over.
func newReplicatedSystem(t *testing.T, opts pgtest.ReplicationOptions) (*system, *pgtest.Replicated, context.Context) {
	t.Helper()
	r, dsn := pgtest.NewReplicated(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	s, err := startSystem(ctx, dsn, pgtest.NewPool(t), &lockedWriter{w: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s, r, ctx
}

// failover kills r's primary and promotes its standby; it says how long
// each took.
func failover(t *testing.T, s *system, r *pgtest.Replicated) string {
	t.Helper()
	start := time.Now()
	if err := r.KillPrimary(); err != nil {
		t.Fatalf("kill the primary: %v", err)
	}
	killed := time.Since(start)
	if err := r.Promote(context.Background()); err != nil {
		t.Fatalf("promote the standby: %v", err)
	}
	s.checkoutDB.Reset() // its connections died with the primary
	return fmt.Sprintf("the primary was gone after %v and the standby accepted writes after %v",
		killed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// checkoutUntilAnswered calls Checkout with key on rep until the answer is
// definitive (OK or an error idem records), waiting as the answers ask. It
// counts the ABORTED answers that told of a lost lease.
func checkoutUntilAnswered(ctx context.Context, rep *replica, key string, leaseLost *int) (*checkoutv1.CheckoutResponse, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		resp, header, err := checkout(ctx, rep, key)
		if err == nil || recorded(status.Convert(err)) {
			return resp, replayed(header), err
		}
		if errorReason(err) == idem.ReasonLeaseLost {
			*leaseLost++
		}
		wait := time.Duration(20+mrand.IntN(30)) * time.Millisecond
		if d, ok := interceptor.RetryDelay(err); ok {
			wait = d
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, false, errors.Join(err, ctx.Err())
		}
	}
}

// TestFailoverLeased runs 48 checkouts (leased mode, three steps, the
// charge at a provider outside the failing database) from 16 clients while
// the checkout database fails over: the primary's processes are killed
// with SIGKILL midway and the standby promoted. Every checkout is then
// retried once more. Whatever the standby had not received is lost; what
// it had is a prefix of the primary's history, which the key's steps and
// fencing token handle as they handle a crash: every checkout ends with one
// reservation, one order and one charge at the provider, the charge its
// first answer named. With a synchronous standby nothing acknowledged is
// lost, and every retry gets its first answer.
func TestFailoverLeased(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	for _, synchronous := range []bool{true, false} {
		name := "asynchronous"
		if synchronous {
			name = "synchronous"
		}
		t.Run(name, func(t *testing.T) { testFailoverLeased(t, synchronous) })
	}
}

func testFailoverLeased(t *testing.T, synchronous bool) {
	const (
		numCheckouts = 48
		numClients   = 16
	)
	s, r, ctx := newReplicatedSystem(t, pgtest.ReplicationOptions{Synchronous: synchronous})
	if err := checkoutsvc.Restock(ctx, s.checkoutDB, sku, numCheckouts*quantity); err != nil {
		t.Fatal(err)
	}
	rep, err := s.startReplica(ctx, "A", replicaConfig{grace: lease()})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.stop()

	type result struct {
		key            string
		first, again   *checkoutv1.CheckoutResponse
		firstErr       error
		againErr       error
		againReplayed  bool
		leaseLost      int
		lostKey, older bool // after the failover: the key's row was gone, or not recorded
	}
	results := make([]*result, numCheckouts)
	for i := range results {
		results[i] = &result{key: newKey()}
	}
	run := func(again bool) {
		ch := make(chan *result)
		var wg sync.WaitGroup
		for range numClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for res := range ch {
					if again {
						res.again, res.againReplayed, res.againErr = checkoutUntilAnswered(ctx, rep, res.key, &res.leaseLost)
					} else {
						res.first, _, res.firstErr = checkoutUntilAnswered(ctx, rep, res.key, &res.leaseLost)
					}
				}
			}()
		}
		for i, res := range results {
			if !again && i == numCheckouts/2 {
				time.Sleep(time.Duration(mrand.IntN(20)) * time.Millisecond)
				t.Logf("failover: %s", failover(t, s, r))
			}
			ch <- res
		}
		close(ch)
		wg.Wait()
	}
	run(false)

	lost, older := 0, 0
	for _, res := range results {
		if res.firstErr != nil {
			t.Fatalf("checkout %s: %v", res.key, res.firstErr)
		}
		rows, err := s.rows(ctx, res.key)
		if err != nil {
			t.Fatal(err)
		}
		switch rows.keyStatus {
		case "":
			res.lostKey = true
			lost++
		case "recorded":
		default:
			res.older = true
			older++
		}
	}
	t.Logf("after the failover, of %d acknowledged checkouts: %d keys lost, %d keys back at an earlier step", numCheckouts, lost, older)
	if synchronous && lost+older > 0 {
		t.Errorf("%d keys lost and %d back at an earlier step with a synchronous standby, want none", lost, older)
	}

	run(true)
	leaseLost := 0
	for _, res := range results {
		leaseLost += res.leaseLost
		rows, err := s.rows(ctx, res.key)
		if err != nil {
			t.Fatal(err)
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Errorf("checkout %s (key lost %v, back at an earlier step %v): "+format, append([]any{res.key, res.lostKey, res.older}, args...)...)
		}
		if res.againErr != nil {
			fail("the retry after the failover: %v", res.againErr)
			continue
		}
		// The charge left the database: it happened once, under the
		// charge step's derived key, whatever the failover lost.
		if rows.charges != 1 || res.first.GetChargeId() != rows.chargeID || res.again.GetChargeId() != rows.chargeID {
			fail("%d charges (%s); the first answer named %s, the retry %s", rows.charges, rows.chargeID,
				res.first.GetChargeId(), res.again.GetChargeId())
		}
		if rows.reservations != 1 || rows.orders != 1 || rows.orderCharge != rows.chargeID || rows.orderRes != rows.reservationID {
			fail("%d reservations and %d orders, the order on %s paid with %s; want one of each, on the reservation %s and the charge %s",
				rows.reservations, rows.orders, rows.orderRes, rows.orderCharge, rows.reservationID, rows.chargeID)
		}
		if rows.keyStatus != "recorded" || rows.responseCode != int(codes.OK) {
			fail("the key is %q with code %d, want recorded with OK", rows.keyStatus, rows.responseCode)
		}
		for _, w := range rows.answers(res.again) {
			fail("%s", w)
		}
		if !res.lostKey && !res.older && (!res.againReplayed || !proto.Equal(res.again, res.first)) {
			fail("the retry got %v (replayed %v), the first answer was %v", res.again, res.againReplayed, res.first)
		}
	}
	tot, err := s.totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The reservation and the stock it takes commit together: no failover
	// parts them.
	if want := initialStock + numCheckouts*quantity - tot.reservations*quantity; tot.stock != want {
		t.Errorf("%d in stock with %d reservations, want %d", tot.stock, tot.reservations, want)
	}
	if tot.charges != numCheckouts || tot.orders != numCheckouts || tot.reservations != numCheckouts {
		t.Errorf("%d charges, %d orders, %d reservations in all; want %d of each", tot.charges, tot.orders, tot.reservations, numCheckouts)
	}
	t.Logf("%d Charge calls reached the provider for %d charges; clients were told %d times that a lease was lost",
		tot.chargeCalls, tot.charges, leaseLost)
}

// recorded reports whether idem records an error of st's code, as it does
// by default (idem.WithClassifier): such an answer is definitive, and a
// retry under the same key gets it again.
func recorded(st *status.Status) bool {
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.AlreadyExists, codes.NotFound:
		return true
	}
	return false
}
