package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	"github.com/idemkit/idem/examples/checkout/providersvc"
	checkoutv1 "github.com/idemkit/idem/examples/gen/checkout/v1"
	idemv1 "github.com/idemkit/idem/gen/idem/v1"
	"github.com/idemkit/idem/interceptor"
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
	srv, err := providersvc.NewServer(providerDB, s.provider)
	if err != nil {
		return nil, err
	}
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

// startReplica starts a checkout replica configured by cfg.
func (s *system) startReplica(ctx context.Context, name string, cfg replicaConfig) (*replica, error) {
	return startReplica(ctx, name, s.checkoutDSN, s.providerAddr, cfg, s.logs)
}

// newKey returns a fresh idempotency key for a checkout.
func newKey() string { return "checkout-" + rand.Text() }

// checkout calls Checkout with key on r and returns the answer, its header
// and whether it was a replay.
func checkout(ctx context.Context, r *replica, key string) (*checkoutv1.CheckoutResponse, metadata.MD, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, key)
	var header metadata.MD
	resp, err := r.client.Checkout(ctx, request(), grpc.Header(&header))
	return resp, header, err
}

// replayed reports whether header marks a replay.
func replayed(header metadata.MD) bool { return len(header.Get(idem.ReplayedHeader)) > 0 }

// retryWhileAborted retries the checkout of key on r for as long as the
// answer is ABORTED, waiting as long as each answer's RetryInfo asks; err
// is the answer that came before. It returns the last answer and the
// delays it waited.
func retryWhileAborted(ctx context.Context, r *replica, key string, err error) (*checkoutv1.CheckoutResponse, metadata.MD, []time.Duration, error) {
	var waited []time.Duration
	for range 10 {
		d, ok := interceptor.RetryDelay(err)
		if status.Code(err) != codes.Aborted || !ok {
			break
		}
		waited = append(waited, d)
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, nil, waited, ctx.Err()
		}
		var resp *checkoutv1.CheckoutResponse
		var header metadata.MD
		if resp, header, err = checkout(ctx, r, key); status.Code(err) != codes.Aborted {
			return resp, header, waited, err
		}
	}
	return nil, nil, waited, err
}

// story is one checkout whose first attempt went to a replica that died at
// crashAt, and whose client's retries went to a second replica.
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

// play runs one story: a checkout sent to a replica that dies at crashAt,
// retried at once on a second replica, retried again after the delay the
// answer asked for, and once more after it completed. The second replica's
// finisher waits a lease longer than the retry (its grace), as it would
// for a client that retries as asked.
func (s *system) play(ctx context.Context, crashAt string) (*story, error) {
	st := &story{crashAt: crashAt, key: newKey()}
	a, err := s.startReplica(ctx, "A", replicaConfig{crashAt: runnerCall + ":" + crashAt, grace: lease()})
	if err != nil {
		return nil, err
	}
	defer a.stop()
	b, err := s.startReplica(ctx, "B", replicaConfig{grace: lease()})
	if err != nil {
		return nil, err
	}
	defer b.stop()

	_, _, st.firstErr = checkout(ctx, a, st.key)
	st.firstExit = a.wait(ctx)
	st.first = a.events(st.key)

	// The crashed attempt's lease still runs: the retry is told to wait.
	_, _, st.busy = checkout(ctx, b, st.key)
	st.busyDelay, _ = interceptor.RetryDelay(st.busy)
	var header metadata.MD
	st.resp, header, st.waited, st.err = retryWhileAborted(ctx, b, st.key, st.busy)
	st.replayed = replayed(header)
	st.again, header, st.againErr = checkout(ctx, b, st.key)
	st.againReplayed = replayed(header)
	if err := b.stop(); err != nil {
		return nil, fmt.Errorf("replica B: %w", err)
	}
	st.second = b.events(st.key)
	return st, nil
}

// savedBefore returns the steps saved when a call died at point: those a
// takeover finds done.
func savedBefore(point string) []string {
	switch point {
	case checkoutsvc.StepReserve, checkoutsvc.PointChargeAnswered:
		return []string{checkoutsvc.StepReserve}
	case checkoutsvc.StepCharge, checkoutsvc.PointOrderMade:
		return []string{checkoutsvc.StepReserve, checkoutsvc.StepCharge}
	case checkoutsvc.StepConfirm:
		return []string{checkoutsvc.StepReserve, checkoutsvc.StepCharge, checkoutsvc.StepConfirm}
	}
	return nil
}

// steps are Checkout's steps in order.
var steps = []string{checkoutsvc.StepReserve, checkoutsvc.StepCharge, checkoutsvc.StepConfirm}

// resumed checks that run, the events of a takeover's run, started afresh
// and found exactly the steps in saved done; it returns what is wrong.
func resumed(run []event, saved []string) []string {
	var wrong []string
	if len(run) == 0 || run[0].point != checkoutsvc.PointStarted {
		return []string{fmt.Sprintf("the takeover reported %v, want it to start with %s", run, checkoutsvc.PointStarted)}
	}
	for _, step := range steps {
		i := slices.IndexFunc(run, func(e event) bool { return e.point == step })
		if i < 0 {
			wrong = append(wrong, fmt.Sprintf("the takeover did not reach step %s: %v", step, run))
			continue
		}
		if want := slices.Contains(saved, step); strings.HasSuffix(run[i].detail, checkoutsvc.Resumed) != want {
			wrong = append(wrong, fmt.Sprintf("the takeover's step %s: %q, want resumed=%v", step, run[i].detail, want))
		}
	}
	return wrong
}

// rows are the side effects of one checkout's key, as the databases hold
// them.
type rows struct {
	charges       int    // charges under the derived key
	chargeID      string // the id of one of them
	chargeCalls   int    // Charge calls that carried the derived key
	reservations  int
	reservationID string
	orders        int
	orderID       string // the order, as the orders table holds it
	orderRes      string
	orderCharge   string
	keyStatus     string        // the checkout key's idem row
	lastStep      string        // the name of the step it saved last
	responseCode  int           // its recorded gRPC code, -1 for none
	requestKept   bool          // it still holds the request for a finisher
	takeovers     int           // how often it was taken over
	expiresIn     time.Duration // how long it still lives
}

// chargeKey is the key of the provider call that the checkout keyed key
// makes: its child key for checkoutsvc.StepCharge, as idem.ChildKey derives
// it, the hex-encoded SHA-256 of the checkout's tenant, method and key and
// the step, each preceded by its length in bytes as a big-endian uint64.
// The checkout server has no tenants, so every request is in the empty one.
func chargeKey(key string) string {
	h := sha256.New()
	for _, s := range []string{"", checkoutv1.CheckoutService_Checkout_FullMethodName, key, checkoutsvc.StepCharge} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (s *system) rows(ctx context.Context, key string) (rows, error) {
	var r rows
	derived := chargeKey(key)
	r.chargeCalls = s.provider.CallsWithKey(derived)
	var expiresIn float64
	for _, q := range []struct {
		db   *pgxpool.Pool
		sql  string
		dest []any
	}{
		{s.providerDB, `SELECT count(*), coalesce(min(id), '') FROM charges WHERE request_key = $1`, []any{&r.charges, &r.chargeID}},
		{s.checkoutDB, `SELECT count(*), coalesce(min(id::text), '') FROM reservations WHERE request_key = $1`, []any{&r.reservations, &r.reservationID}},
		{s.checkoutDB, `SELECT count(*), coalesce(min(id::text), ''), coalesce(min(reservation_id::text), ''), coalesce(min(charge_id), '')
			FROM orders WHERE request_key = $1`, []any{&r.orders, &r.orderID, &r.orderRes, &r.orderCharge}},
		{s.checkoutDB, `SELECT coalesce(min(status), ''), coalesce(min(step_names[cardinality(step_names)]), ''), coalesce(min(response_code), -1),
				coalesce(bool_or(request_method IS NOT NULL OR request_payload IS NOT NULL OR request_header_names IS NOT NULL), false),
				coalesce(min(takeovers), 0), coalesce(extract(epoch FROM min(expires_at) - now())::float8, 0)
			FROM idempotency_keys WHERE key = $1`,
			[]any{&r.keyStatus, &r.lastStep, &r.responseCode, &r.requestKept, &r.takeovers, &expiresIn}},
	} {
		arg := key
		if q.db == s.providerDB {
			arg = derived
		}
		if err := q.db.QueryRow(ctx, q.sql, arg).Scan(q.dest...); err != nil {
			return r, err
		}
	}
	r.expiresIn = time.Duration(expiresIn * float64(time.Second))
	return r, nil
}

// once returns what is wrong with r for a checkout that ended: every
// side effect exists once and the key is recorded, its request dropped.
// The provider was asked chargeCalls times under the derived key.
func (r rows) once(chargeCalls int) []string {
	var wrong []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			wrong = append(wrong, fmt.Sprintf(format, args...))
		}
	}
	check(r.charges == 1, "%d charges under the derived key, want 1", r.charges)
	check(r.chargeCalls == chargeCalls, "%d Charge calls under the derived key, want %d", r.chargeCalls, chargeCalls)
	check(r.reservations == 1, "%d reservations, want 1", r.reservations)
	check(r.orders == 1, "%d orders, want 1", r.orders)
	check(r.orderCharge == r.chargeID && r.orderRes == r.reservationID,
		"the order was paid with %q on reservation %q, want the provider's %q on %q", r.orderCharge, r.orderRes, r.chargeID, r.reservationID)
	check(r.keyStatus == "recorded" && r.responseCode == int(codes.OK) && r.lastStep == checkoutsvc.StepConfirm,
		"the key is %q with code %d at %q, want recorded with OK at %s", r.keyStatus, r.responseCode, r.lastStep, checkoutsvc.StepConfirm)
	check(!r.requestKept, "the recorded key still holds its request")
	return wrong
}

// answers returns what is wrong with resp, an answer to the checkout whose
// rows are r: it must name them.
func (r rows) answers(resp *checkoutv1.CheckoutResponse) []string {
	want := &checkoutv1.CheckoutResponse{OrderId: r.orderID, ReservationId: r.reservationID, ChargeId: r.chargeID, AmountCents: quantity * unitPrice}
	if !proto.Equal(resp, want) {
		return []string{fmt.Sprintf("the answer %v does not name the rows %v", resp, want)}
	}
	return nil
}

// totals are the side effects of every checkout.
type totals struct {
	charges, chargeCalls, reservations, orders, stock int
}

func (s *system) totals(ctx context.Context) (totals, error) {
	t := totals{chargeCalls: len(s.provider.Calls())}
	for _, q := range []struct {
		db  *pgxpool.Pool
		sql string
		n   *int
	}{
		{s.providerDB, `SELECT count(*) FROM charges`, &t.charges},
		{s.checkoutDB, `SELECT count(*) FROM reservations`, &t.reservations},
		{s.checkoutDB, `SELECT count(*) FROM orders`, &t.orders},
		{s.checkoutDB, `SELECT available FROM stock WHERE sku = '` + sku + `'`, &t.stock},
	} {
		if err := q.db.QueryRow(ctx, q.sql).Scan(q.n); err != nil {
			return t, err
		}
	}
	return t, nil
}

// broken returns the invariants st and its rows break: the crash left the
// client without an answer, the retry during the lease was refused, the
// retry after it resumed where the crashed attempt stopped, and every side
// effect happened once.
func (st *story) broken(r rows) []string {
	var failed []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			failed = append(failed, fmt.Sprintf(format, args...))
		}
	}
	check(status.Code(st.firstErr) == codes.Unavailable && st.firstExit != nil,
		"the first attempt answered %v and its replica ended with %v, want UNAVAILABLE from a killed process", st.firstErr, st.firstExit)
	check(len(st.first) > 0 && st.first[len(st.first)-1].point == st.crashAt,
		"the crashed replica reported %v, want it to stop at %s", st.first, st.crashAt)

	reason := errorReason(st.busy)
	check(status.Code(st.busy) == codes.Aborted && reason == idem.ReasonKeyInUse && st.busyDelay > 0 && st.busyDelay <= lease(),
		"the retry during the lease got %v (reason %q, delay %v), want ABORTED %s with a delay in (0, %v]",
		st.busy, reason, st.busyDelay, idem.ReasonKeyInUse, lease())

	check(st.err == nil && !st.replayed, "the retry after the lease: err=%v replayed=%v, want a fresh answer", st.err, st.replayed)
	var run []event // the retry's run: its handler's points
	for _, e := range st.second {
		if e.runner == runnerCall && e.point != pointOutcome {
			run = append(run, e)
		}
	}
	failed = append(failed, resumed(run, savedBefore(st.crashAt))...)
	check(!slices.ContainsFunc(st.second, func(e event) bool { return e.runner == runnerFinisher }),
		"the finisher ran the checkout the client retried: %v", st.second)
	check(st.againErr == nil && st.againReplayed && proto.Equal(st.again, st.resp),
		"a later retry: %v (err %v, replayed %v), want %v replayed", st.again, st.againErr, st.againReplayed, st.resp)

	chargeCalls := 1
	if st.crashAt == checkoutsvc.PointChargeAnswered {
		chargeCalls = 2 // the retry asked again, under the same key
		check(slices.Contains(run, event{runnerCall, st.key, checkoutsvc.PointChargeAnswered, r.chargeID + checkoutsvc.Replayed}),
			"the retry's provider call was not a replay of charge %s: %v", r.chargeID, run)
	}
	failed = append(failed, r.once(chargeCalls)...)
	failed = append(failed, r.answers(st.resp)...)
	for i := range failed {
		failed[i] = fmt.Sprintf("crash at %s: %s", st.crashAt, failed[i])
	}
	return failed
}

// errorReason returns the ErrorInfo reason of err, if any.
func errorReason(err error) string {
	if s, ok := status.FromError(err); ok {
		for _, d := range s.Details() {
			if ei, ok := d.(*errdetails.ErrorInfo); ok {
				return ei.GetReason()
			}
		}
	}
	return ""
}

// abandonment is one checkout whose replica died at crashAt and whose
// client gave up: it never retried until the checkout was finished. A
// finisher on a second replica finished it.
type abandonment struct {
	crashAt string
	key     string

	first     []event // what the dying replica reported
	firstErr  error   // the client's answer from it, after which it gave up
	firstExit error
	abandoned rows // the key's rows once the replica had died

	finisher []event       // what the finisher's replica reported
	took     time.Duration // from the client's answer to the recorded outcome
}

// abandon sends a checkout to a replica that dies at crashAt, while a
// second replica runs a finisher with grace, and waits until that
// finisher has recorded the checkout's outcome.
func (s *system) abandon(ctx context.Context, crashAt string, grace time.Duration) (*abandonment, error) {
	ab := &abandonment{crashAt: crashAt, key: newKey()}
	a, err := s.startReplica(ctx, "A", replicaConfig{crashAt: runnerCall + ":" + crashAt, grace: grace})
	if err != nil {
		return nil, err
	}
	defer a.stop()
	b, err := s.startReplica(ctx, "B", replicaConfig{grace: grace})
	if err != nil {
		return nil, err
	}
	defer b.stop()

	_, _, ab.firstErr = checkout(ctx, a, ab.key)
	start := time.Now()
	ab.firstExit = a.wait(ctx)
	ab.first = a.events(ab.key)
	if ab.abandoned, err = s.rows(ctx, ab.key); err != nil {
		return nil, err
	}
	if _, err := b.waitFor(ctx, outcome(runnerFinisher, ab.key, idem.ResultExecuted)); err != nil {
		return nil, fmt.Errorf("waiting for the finisher: %w (it reported %v)", err, b.events(ab.key))
	}
	ab.took = time.Since(start)
	if err := b.stop(); err != nil {
		return nil, fmt.Errorf("replica B: %w", err)
	}
	ab.finisher = b.events(ab.key)
	return ab, nil
}

// broken returns the invariants ab and its rows break: the client got no
// answer, the finisher alone ran the checkout again, resuming after the
// steps saved before the crash, and every side effect happened once.
func (ab *abandonment) broken(r rows) []string {
	var failed []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			failed = append(failed, fmt.Sprintf(format, args...))
		}
	}
	check(status.Code(ab.firstErr) == codes.Unavailable && ab.firstExit != nil,
		"the first attempt answered %v and its replica ended with %v, want UNAVAILABLE from a killed process", ab.firstErr, ab.firstExit)
	check(len(ab.first) > 0 && ab.first[len(ab.first)-1].point == ab.crashAt,
		"the crashed replica reported %v, want it to stop at %s", ab.first, ab.crashAt)
	saved, last := savedBefore(ab.crashAt), ""
	if len(saved) > 0 {
		last = saved[len(saved)-1]
	}
	check(ab.abandoned.keyStatus == "in_progress" && ab.abandoned.requestKept && ab.abandoned.lastStep == last && ab.abandoned.orders == 0,
		"once abandoned, the key was %q at %q with request kept=%v and %d orders, want in progress at %q with the request kept and no order",
		ab.abandoned.keyStatus, ab.abandoned.lastStep, ab.abandoned.requestKept, ab.abandoned.orders, last)
	var run, outcomes []event
	for _, e := range ab.finisher {
		switch {
		case e.runner != runnerFinisher:
			check(false, "the second replica served a call of the abandoned key: %v", e)
		case e.point == pointOutcome:
			outcomes = append(outcomes, e)
		default:
			run = append(run, e)
		}
	}
	check(len(outcomes) == 1 && outcomes[0].detail == string(idem.ResultExecuted),
		"the finisher's outcomes: %v, want one, executed", outcomes)
	failed = append(failed, resumed(run, saved)...)
	chargeCalls := 1
	if ab.crashAt == checkoutsvc.PointChargeAnswered {
		chargeCalls = 2 // the finisher asked again, under the same key
	}
	failed = append(failed, r.once(chargeCalls)...)
	return failed
}

// lateRetry is the client's retry of a checkout it gave up on, made long
// after, on a replica started since.
type lateRetry struct {
	resp     *checkoutv1.CheckoutResponse
	err      error
	replayed bool
	expires  string  // the answer's idempotency-key-expires header
	events   []event // what the replica reported
}

// retryLater retries the checkout of key on a new replica.
func (s *system) retryLater(ctx context.Context, key string) (*lateRetry, error) {
	c, err := s.startReplica(ctx, "C", replicaConfig{grace: lease()})
	if err != nil {
		return nil, err
	}
	defer c.stop()
	lr := &lateRetry{}
	var header metadata.MD
	lr.resp, header, lr.err = checkout(ctx, c, key)
	lr.replayed = replayed(header)
	if v := header.Get(idem.ExpiresHeader); len(v) == 1 {
		lr.expires = v[0]
	}
	if err := c.stop(); err != nil {
		return nil, fmt.Errorf("replica C: %w", err)
	}
	lr.events = c.events(key)
	return lr, nil
}

// broken returns the invariants lr breaks for the checkout whose rows are
// r: the retry got the recorded answer replayed, and nothing ran.
func (lr *lateRetry) broken(r rows) []string {
	var failed []string
	if lr.err != nil || !lr.replayed || lr.expires == "" {
		failed = append(failed, fmt.Sprintf("the late retry: err=%v replayed=%v expires=%q, want a replay that tells the key's expiry", lr.err, lr.replayed, lr.expires))
	}
	failed = append(failed, r.answers(lr.resp)...)
	if len(lr.events) != 1 || lr.events[0].point != pointOutcome || lr.events[0].detail != string(idem.ResultReplayed) {
		failed = append(failed, fmt.Sprintf("the late retry's replica reported %v, want a replay and nothing run", lr.events))
	}
	return failed
}
