package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	"github.com/idemkit/idem/examples/checkout/providersvc"
	checkoutv1 "github.com/idemkit/idem/examples/gen/checkout/v1"
	idemv1 "github.com/idemkit/idem/gen/idem/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store"
)

// What every checkout of the example buys.
const (
	sku          = "sku-espresso-beans"
	initialStock = 10
	quantity     = 2
	unitPrice    = 1250
)

// request is the checkout request of the example.
func request() *checkoutv1.CheckoutRequest {
	return &checkoutv1.CheckoutRequest{CustomerId: "cus_42", Sku: sku, Quantity: quantity, UnitPriceCents: unitPrice, Currency: "EUR"}
}

// lease is Checkout's lease, as its proto option declares it.
func lease() time.Duration {
	md := checkoutv1.File_checkout_v1_checkout_proto.Services().ByName("CheckoutService").Methods().ByName("Checkout")
	p, _ := proto.GetExtension(md.Options(), idemv1.E_Method).(*idemv1.MethodPolicy)
	return p.GetLease().AsDuration()
}

// system is the stub provider, served in this process on its own database,
// and the checkout database, which replicas (child processes) serve.
type system struct {
	checkoutDSN  string
	checkoutDB   *pgxpool.Pool
	providerDB   *pgxpool.Pool
	provider     *providersvc.Stub
	providerAddr string
	logs         io.Writer // the replicas' standard error
	stop         []func()
}

// startSystem migrates both databases, stocks initialStock items of sku
// and starts the provider.
func startSystem(ctx context.Context, checkoutDSN string, providerDB *pgxpool.Pool, logs io.Writer) (*system, error) {
	s := &system{checkoutDSN: checkoutDSN, providerDB: providerDB, provider: &providersvc.Stub{}, logs: logs}
	var err error
	if s.checkoutDB, err = pgxpool.New(ctx, checkoutDSN); err != nil {
		return nil, err
	}
	s.stop = append(s.stop, s.checkoutDB.Close)
	if err := checkoutsvc.Migrate(ctx, s.checkoutDB); err != nil {
		s.close()
		return nil, err
	}
	if err := checkoutsvc.Restock(ctx, s.checkoutDB, sku, initialStock); err != nil {
		s.close()
		return nil, err
	}
	if err := providersvc.Migrate(ctx, providerDB); err != nil {
		s.close()
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.close()
		return nil, err
	}
	srv := providersvc.NewServer(providerDB, s.provider)
	go func() { _ = srv.Serve(lis) }()
	s.stop = append(s.stop, srv.Stop)
	s.providerAddr = lis.Addr().String()
	return s, nil
}

func (s *system) close() {
	for _, f := range slices.Backward(s.stop) {
		f()
	}
}

// story is one checkout whose first attempt went to a replica that died at
// crashAt, and whose retries went to a second replica.
type story struct {
	crashAt string
	key     string

	first     []event // what the crashing replica reported
	firstErr  error   // the client's answer from it
	firstExit error   // how it ended

	busy      error         // the retry sent at once, while the lease ran
	busyDelay time.Duration // the delay its RetryInfo asked for
	waited    []time.Duration

	second   []event // what the second replica reported
	resp     *checkoutv1.CheckoutResponse
	err      error
	replayed bool // resp was a replay (it must not be)

	again         *checkoutv1.CheckoutResponse // a later retry's answer
	againErr      error
	againReplayed bool
}

// checkout calls Checkout with key on r.
func checkout(ctx context.Context, r *replica, key string) (*checkoutv1.CheckoutResponse, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, interceptor.KeyHeader, key)
	var header metadata.MD
	resp, err := r.client.Checkout(ctx, request(), grpc.Header(&header))
	return resp, len(header.Get(interceptor.ReplayedHeader)) > 0, err
}

// play runs one story: a checkout sent to a replica that dies at crashAt,
// retried at once on a second replica, retried again after the delay the
// answer asked for, and once more after it completed.
func (s *system) play(ctx context.Context, crashAt string) (*story, error) {
	st := &story{crashAt: crashAt, key: "checkout-" + rand.Text()}
	a, err := startReplica(ctx, "A", s.checkoutDSN, s.providerAddr, crashAt, s.logs)
	if err != nil {
		return nil, err
	}
	defer a.stop()
	b, err := startReplica(ctx, "B", s.checkoutDSN, s.providerAddr, "", s.logs)
	if err != nil {
		return nil, err
	}
	defer b.stop()

	_, _, st.firstErr = checkout(ctx, a, st.key)
	st.firstExit = a.wait()
	st.first = a.events()

	// The crashed attempt's lease still runs: the retry is told to wait.
	_, _, st.busy = checkout(ctx, b, st.key)
	st.busyDelay, _ = interceptor.RetryDelay(st.busy)
	st.resp, st.replayed, st.err = st.retry(ctx, b, st.busy)
	st.again, st.againReplayed, st.againErr = checkout(ctx, b, st.key)
	if err := b.stop(); err != nil {
		return nil, fmt.Errorf("replica B: %w", err)
	}
	st.second = b.events()
	return st, nil
}

// retry retries the checkout on r for as long as the answer is ABORTED,
// waiting as long as each answer's RetryInfo asks.
func (st *story) retry(ctx context.Context, r *replica, err error) (*checkoutv1.CheckoutResponse, bool, error) {
	for range 10 {
		d, ok := interceptor.RetryDelay(err)
		if status.Code(err) != codes.Aborted || !ok {
			break
		}
		st.waited = append(st.waited, d)
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		var resp *checkoutv1.CheckoutResponse
		var replayed bool
		if resp, replayed, err = checkout(ctx, r, st.key); status.Code(err) != codes.Aborted {
			return resp, replayed, err
		}
	}
	return nil, false, err
}

// resumesAfter is the recovery point a retry finds after a crash at point:
// the last step saved before it.
func resumesAfter(point string) string {
	switch point {
	case checkoutsvc.StepReserved, checkoutsvc.PointChargeAnswered:
		return checkoutsvc.StepReserved
	}
	return point
}

// rows are the side effects of one story's key, as the databases hold them.
type rows struct {
	charges       int    // charges under the derived key
	chargeID      string // the id of one of them
	chargeCalls   int    // Charge calls that carried the derived key
	reservations  int
	orders        int
	orderID       string // the order, as the orders table holds it
	orderRes      string
	orderCharge   string
	keyStatus     string // the checkout key's idem row
	recoveryPoint string
}

// chargeKey is the key of the provider call that the checkout keyed key
// makes: its child key for checkoutsvc.ChargeStep. The checkout server has
// no tenants, so every request is in the empty one.
func chargeKey(key string) string {
	parent := store.Key{Method: checkoutv1.CheckoutService_Checkout_FullMethodName, Key: key}
	return interceptor.DeriveKey(parent, checkoutsvc.ChargeStep)
}

func (s *system) rows(ctx context.Context, key string) (rows, error) {
	var r rows
	derived := chargeKey(key)
	r.chargeCalls = s.provider.CallsWithKey(derived)
	for _, q := range []struct {
		db   *pgxpool.Pool
		sql  string
		dest []any
	}{
		{s.providerDB, `SELECT count(*), coalesce(min(id), '') FROM charges WHERE request_key = $1`, []any{&r.charges, &r.chargeID}},
		{s.checkoutDB, `SELECT count(*) FROM reservations WHERE request_key = $1`, []any{&r.reservations}},
		{s.checkoutDB, `SELECT count(*), coalesce(min(id::text), ''), coalesce(min(reservation_id::text), ''), coalesce(min(charge_id), '')
			FROM orders WHERE request_key = $1`, []any{&r.orders, &r.orderID, &r.orderRes, &r.orderCharge}},
		{s.checkoutDB, `SELECT coalesce(min(status), ''), coalesce(min(recovery_point), '') FROM idempotency_keys WHERE key = $1`,
			[]any{&r.keyStatus, &r.recoveryPoint}},
	} {
		arg := key
		if q.db == s.providerDB {
			arg = derived
		}
		if err := q.db.QueryRow(ctx, q.sql, arg).Scan(q.dest...); err != nil {
			return r, err
		}
	}
	return r, nil
}

// stock returns how many items of sku are left.
func (s *system) stock(ctx context.Context) (int, error) {
	var n int
	err := s.checkoutDB.QueryRow(ctx, `SELECT available FROM stock WHERE sku = $1`, sku).Scan(&n)
	return n, err
}

// broken returns the invariants st and its rows break: the crash left the
// client without an answer, the retry during the lease was refused, the
// retry after it resumed where the crashed attempt stopped, and every side
// effect happened once.
func (st *story) broken(r rows) []string {
	var failed []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			failed = append(failed, fmt.Sprintf("crash at %s: ", st.crashAt)+fmt.Sprintf(format, args...))
		}
	}
	check(status.Code(st.firstErr) == codes.Unavailable && st.firstExit != nil,
		"the first attempt answered %v and its replica ended with %v, want UNAVAILABLE from a killed process", st.firstErr, st.firstExit)
	check(len(st.first) > 0 && st.first[len(st.first)-1].point == st.crashAt,
		"the crashed replica reported %v, want it to stop at %s", st.first, st.crashAt)

	var reason string
	if s, ok := status.FromError(st.busy); ok {
		for _, d := range s.Details() {
			if ei, ok := d.(*errdetails.ErrorInfo); ok {
				reason = ei.GetReason()
			}
		}
	}
	check(status.Code(st.busy) == codes.Aborted && reason == interceptor.ReasonKeyInUse && st.busyDelay > 0 && st.busyDelay <= lease(),
		"the retry during the lease got %v (reason %q, delay %v), want ABORTED %s with a delay in (0, %v]",
		st.busy, reason, st.busyDelay, interceptor.ReasonKeyInUse, lease())

	check(st.err == nil && !st.replayed, "the retry after the lease: err=%v replayed=%v, want a fresh answer", st.err, st.replayed)
	check(len(st.second) > 0 && st.second[0] == event{checkoutsvc.PointStarted, resumesAfter(st.crashAt)},
		"the retry reported %v, want it to start after %q", st.second, resumesAfter(st.crashAt))
	check(st.againErr == nil && st.againReplayed && proto.Equal(st.again, st.resp),
		"a later retry: %v (err %v, replayed %v), want %v replayed", st.again, st.againErr, st.againReplayed, st.resp)

	wantCalls := 1
	if st.crashAt == checkoutsvc.PointChargeAnswered {
		wantCalls = 2 // the retry asked again, under the same key
		check(slices.Contains(st.second, event{checkoutsvc.PointChargeAnswered, r.chargeID + " replayed"}),
			"the retry's provider call was not a replay of charge %s: %v", r.chargeID, st.second)
	}
	check(r.charges == 1, "%d charges under the derived key, want 1", r.charges)
	check(r.chargeCalls == wantCalls, "%d Charge calls under the derived key, want %d", r.chargeCalls, wantCalls)
	check(r.reservations == 1, "%d reservations, want 1", r.reservations)
	check(r.orders == 1, "%d orders, want 1", r.orders)
	check(st.resp.GetChargeId() == r.chargeID && r.orderCharge == r.chargeID,
		"the answer's charge %q and the order's %q are not the provider's %q", st.resp.GetChargeId(), r.orderCharge, r.chargeID)
	check(st.resp.GetOrderId() == r.orderID && st.resp.GetReservationId() == r.orderRes,
		"the answer %v does not name the recorded order %s (reservation %s)", st.resp, r.orderID, r.orderRes)
	check(st.resp.GetAmountCents() == quantity*unitPrice, "the answer charged %d, want %d", st.resp.GetAmountCents(), quantity*unitPrice)
	check(r.keyStatus == "completed" && r.recoveryPoint == checkoutsvc.StepChargeConfirmed,
		"the key is %q at %q, want completed at %s", r.keyStatus, r.recoveryPoint, checkoutsvc.StepChargeConfirmed)
	return failed
}
