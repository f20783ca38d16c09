// Package checkoutsvc implements the example CheckoutService, a handler in
// idem's leased mode that resumes instead of restarting, and finishes even
// when its client has gone.
//
// # Steps
//
// Checkout reserves stock in its own database, charges the customer with a
// payment provider over gRPC and records the order, each an
// [idem.Step] whose result is saved under the request's key as soon
// as the step returns:
//
//	reserve  result: the reservation id
//	charge   result: the provider's charge id
//	confirm  result: the order id
//
// When the worker running Checkout dies, its lease runs out and a retry
// with the same key and request takes the key over. Its steps return the
// results the dead attempt saved without running again: after charge, the
// retry confirms the order with the saved charge id and never calls the
// provider.
//
// # Idempotent steps
//
// A step's result is saved after its effect, so a worker that dies between
// the two makes the takeover run the step again. Each step is therefore
// idempotent under the request's key: the reservation and the order are
// rows unique by the key, and the provider call carries the request's child
// key for [StepCharge] (idem.ChildKey(ctx, StepCharge)), attached by
// idem's client interceptor, so the provider answers a repeated call with
// the charge it already made. When an attempt fails with a transient error
// (the provider unreachable after the client's retries) after a step was
// saved, idem ends the lease but keeps the claim, so the retry takes over
// and resumes after that step too.
//
// # Finishing
//
// Checkout is finishable ((idem.v1.method).finish in its proto): the
// claim keeps the request until the outcome is recorded. When the client
// gives up after its worker died, the [idem.Finisher] that every
// replica runs ([NewFinisher]) takes the abandoned checkout over once its
// lease has run out and a grace period has passed, runs it to the end in
// the same way, and records its outcome, answer or deterministic error,
// which the client's retry, if it comes while the key lives, gets
// replayed. Checkout reads nothing from the request's metadata, so the
// finisher keeps none (finish_headers would name it).
package checkoutsvc

import (
	"context"
	_ "embed"
	"errors"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	checkoutv1 "github.com/idemkit/idem/examples/gen/checkout/v1"
	providerv1 "github.com/idemkit/idem/examples/gen/provider/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

//go:embed schema.sql
var schema string

// Migrate applies idem's migrations and the checkout tables to db.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	if err := postgres.Migrate(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, schema)
	return err
}

// Restock adds n items of sku to the stock in db.
func Restock(ctx context.Context, db *pgxpool.Pool, sku string, n int) error {
	_, err := db.Exec(ctx, `INSERT INTO stock (sku, available) VALUES ($1, $2)
		ON CONFLICT (sku) DO UPDATE SET available = stock.available + excluded.available`, sku, n)
	return err
}

// The steps of Checkout, in the order it runs them. Each runs with
// [idem.Step]: its result is saved under the request's key as soon
// as it returns, and a takeover of the key gets it back without running the
// step again.
const (
	// StepReserve takes the items out of stock; its result is the
	// reservation id.
	StepReserve = "reserve"
	// StepCharge charges the customer with the provider; its result is the
	// provider's charge id. The provider call's idempotency key is
	// idem.ChildKey(ctx, StepCharge), derived from the Checkout
	// request's tenant, method and key.
	StepCharge = "charge"
	// StepConfirm records the order; its result is the order id.
	StepConfirm = "confirm"
)

// Points a [Hook] sees besides the steps.
const (
	// PointStarted: the handler runs, for a new call or a takeover.
	PointStarted = "started"
	// PointReservationMade: inside StepReserve, the reservation is
	// committed and the step is not saved yet. The detail is its id.
	PointReservationMade = "reservation_made"
	// PointChargeAnswered: inside StepCharge, the provider answered and the
	// step is not saved yet. The detail is the charge id, followed by
	// [Replayed] when the provider replayed an earlier answer.
	PointChargeAnswered = "charge_answered"
	// PointOrderMade: inside StepConfirm, the order is committed and the
	// step is not saved yet. The detail is its id.
	PointOrderMade = "order_made"
)

// Suffixes of a Hook's detail.
const (
	// Resumed follows a step's result when an earlier attempt had saved
	// it, so the step did not run again.
	Resumed = " resumed"
	// Replayed follows the charge id of PointChargeAnswered when the
	// provider replayed an earlier answer.
	Replayed = " replayed"
)

// Hook is called as Checkout reaches each point: [PointStarted], each
// step once its result is saved (the detail is the result, followed by
// [Resumed] when an earlier attempt had saved it), and the points inside
// the steps. ctx is the call's: idem.KeyFromContext gives its key.
// It runs on the call's goroutine.
type Hook func(ctx context.Context, point, detail string)

// Option configures a [Service].
type Option func(*Service)

// WithHook sets a function called at each point Checkout reaches, for logs
// and for tests that stop the process at a chosen point. Default: none.
func WithHook(h Hook) Option {
	return func(s *Service) { s.hook = h }
}

// Service implements checkoutv1.CheckoutServiceServer.
type Service struct {
	checkoutv1.UnimplementedCheckoutServiceServer
	pool     *pgxpool.Pool
	provider providerv1.ProviderServiceClient
	hook     Hook
}

// New returns a Service that keeps stock, reservations and orders in pool
// and charges through provider, whose connection must use
// [ClientInterceptors].
func New(pool *pgxpool.Pool, provider providerv1.ProviderServiceClient, opts ...Option) *Service {
	s := &Service{pool: pool, provider: provider, hook: func(context.Context, string, string) {}}
	for _, opt := range opts {
		opt(s)
	}
	return s
}

// NewServer returns a gRPC server with svc registered behind panic recovery
// and idem on svc's database. Checkout's proto options put it in leased
// mode with a 2 s lease, finishable; opts may override them
// ([idem.WithMethodPolicy]).
func NewServer(svc *Service, opts ...idem.Option) (*grpc.Server, error) {
	engine, err := idem.New(postgres.New(svc.pool), opts...)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Internal, "internal error")
		})),
		interceptor.UnaryServerInterceptor(engine),
	))
	checkoutv1.RegisterCheckoutServiceServer(srv, svc)
	return srv, nil
}

// NewFinisher returns a finisher of the checkouts abandoned on svc's
// database, with svc registered: run it (Run) on every replica. opts must
// be the server's ([NewServer]), so that it runs Checkout as the server
// would; fopts set its grace and pace.
func NewFinisher(svc *Service, opts []idem.Option, fopts ...idem.FinisherOption) (*idem.Finisher, error) {
	engine, err := idem.New(postgres.New(svc.pool), opts...)
	if err != nil {
		return nil, err
	}
	f, err := idem.NewFinisher(engine, fopts...)
	if err != nil {
		return nil, err
	}
	checkoutv1.RegisterCheckoutServiceServer(interceptor.FinisherRegistrar(f), svc)
	return f, nil
}

// ClientInterceptors returns the unary client interceptors for the
// connection to the provider, in chain order: idem first, so that the
// derived key is attached once, then retries of UNAVAILABLE and ABORTED
// (waiting as long as the provider's RetryInfo asks), every one of which
// carries that key.
func ClientInterceptors() []grpc.UnaryClientInterceptor {
	return []grpc.UnaryClientInterceptor{
		interceptor.UnaryClientInterceptor(),
		retry.UnaryClientInterceptor(
			retry.WithMax(5),
			retry.WithCodes(codes.Unavailable, codes.Aborted),
			retry.WithBackoff(interceptor.BackoffRetryInfo(retry.BackoffExponentialWithJitter(20*time.Millisecond, 0.2))),
		),
	}
}

// Checkout reserves stock, charges the customer and records the order,
// each a step that runs once per key: a takeover, by a retry or a
// finisher, skips the steps an earlier attempt saved. Too little stock
// fails it with FAILED_PRECONDITION, which idem records as the key's
// answer.
func (s *Service) Checkout(ctx context.Context, req *checkoutv1.CheckoutRequest) (*checkoutv1.CheckoutResponse, error) {
	if req.GetCustomerId() == "" || req.GetSku() == "" || req.GetQuantity() <= 0 ||
		req.GetUnitPriceCents() <= 0 || len(req.GetCurrency()) != 3 {
		return nil, status.Error(codes.InvalidArgument, "customer_id, sku, a positive quantity and unit price and a three-letter currency are required")
	}
	key, ok := idem.KeyFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "Checkout must run under the idem interceptor")
	}
	s.hook(ctx, PointStarted, "")
	reservation, err := s.step(ctx, StepReserve, func(ctx context.Context) (string, error) { return s.reserve(ctx, key, req) })
	if err != nil {
		return nil, err
	}
	charge, err := s.step(ctx, StepCharge, func(ctx context.Context) (string, error) { return s.charge(ctx, req) })
	if err != nil {
		return nil, err
	}
	order, err := s.step(ctx, StepConfirm, func(ctx context.Context) (string, error) { return s.confirm(ctx, key, charge, req) })
	if err != nil {
		return nil, err
	}
	return &checkoutv1.CheckoutResponse{OrderId: order, ReservationId: reservation, ChargeId: charge, AmountCents: amount(req)}, nil
}

// step runs fn as the step name of the call ([idem.Step]) and tells
// the hook once its result is saved. Errors are returned as they are:
// store.ErrLeaseLost tells idem that another attempt took the key over.
func (s *Service) step(ctx context.Context, name string, fn func(context.Context) (string, error)) (string, error) {
	ran := false
	result, err := idem.Step(ctx, name, func(ctx context.Context) ([]byte, error) {
		ran = true
		id, err := fn(ctx)
		return []byte(id), err
	})
	if err != nil {
		return "", err
	}
	detail := string(result)
	if !ran {
		detail += Resumed
	}
	s.hook(ctx, name, detail)
	return string(result), nil
}

func amount(req *checkoutv1.CheckoutRequest) int64 {
	return int64(req.GetQuantity()) * req.GetUnitPriceCents()
}

var errOutOfStock = errors.New("out of stock")

// reserve takes the request's quantity out of stock, once per key, and
// returns the reservation's id.
func (s *Service) reserve(ctx context.Context, key string, req *checkoutv1.CheckoutRequest) (string, error) {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO reservations (request_key, sku, quantity) VALUES ($1, $2, $3)
			ON CONFLICT (request_key) DO NOTHING`, key, req.GetSku(), req.GetQuantity())
		if err != nil || tag.RowsAffected() == 0 {
			return err // reserved already by an attempt that died before saving the step
		}
		tag, err = tx.Exec(ctx, `UPDATE stock SET available = available - $2 WHERE sku = $1 AND available >= $2`,
			req.GetSku(), req.GetQuantity())
		if err == nil && tag.RowsAffected() == 0 {
			err = errOutOfStock
		}
		return err
	})
	if errors.Is(err, errOutOfStock) {
		return "", status.Errorf(codes.FailedPrecondition, "fewer than %d of %s in stock", req.GetQuantity(), req.GetSku())
	}
	if err != nil {
		return "", err
	}
	var id string
	if err := s.pool.QueryRow(ctx, `SELECT id::text FROM reservations WHERE request_key = $1`, key).Scan(&id); err != nil {
		return "", err
	}
	s.hook(ctx, PointReservationMade, id)
	return id, nil
}

// charge asks the provider for the request's amount and returns the charge
// id. ctx is the charge step's, so the call carries the step's child key.
// The provider request depends on the checkout request alone, never on
// values generated along the way (such as the reservation id): a repeated
// call must be the same request under the same derived key, or the
// provider rejects it as a reused key.
func (s *Service) charge(ctx context.Context, req *checkoutv1.CheckoutRequest) (string, error) {
	var header metadata.MD
	resp, err := s.provider.Charge(ctx, &providerv1.ChargeRequest{
		CustomerId:  req.GetCustomerId(),
		AmountCents: amount(req),
		Currency:    req.GetCurrency(),
	}, grpc.Header(&header))
	if err != nil {
		// A declining provider would also release the reservation here;
		// the stub only rejects requests that Checkout has validated.
		return "", err
	}
	detail := resp.GetChargeId()
	if len(header.Get(idem.ReplayedHeader)) > 0 {
		detail += Replayed
	}
	s.hook(ctx, PointChargeAnswered, detail)
	return resp.GetChargeId(), nil
}

// confirm records the order paid with chargeID, once per key, and returns
// its id.
func (s *Service) confirm(ctx context.Context, key, chargeID string, req *checkoutv1.CheckoutRequest) (string, error) {
	if _, err := s.pool.Exec(ctx, `INSERT INTO orders (request_key, reservation_id, charge_id, amount_cents, currency)
		SELECT $1, r.id, $2, $3, $4 FROM reservations r WHERE r.request_key = $1
		ON CONFLICT (request_key) DO NOTHING`,
		key, chargeID, amount(req), req.GetCurrency()); err != nil {
		return "", err
	}
	var id string
	if err := s.pool.QueryRow(ctx, `SELECT id::text FROM orders WHERE request_key = $1`, key).Scan(&id); err != nil {
		return "", err
	}
	s.hook(ctx, PointOrderMade, id)
	return id, nil
}
