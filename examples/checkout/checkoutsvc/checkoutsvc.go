// Package checkoutsvc implements the example CheckoutService, a handler in
// idem's leased mode that resumes instead of restarting.
//
// # Steps
//
// Checkout reserves stock in its own database, charges the customer with a
// payment provider over gRPC and records the order. After each step it
// saves a recovery point with [interceptor.SaveRecoveryPoint], durable at
// once:
//
//	reserved          payload: the reservation id
//	charge_sent       payload: the provider's charge id
//	charge_confirmed  payload: the order id
//
// When the worker running Checkout dies, its lease runs out and a retry
// with the same key and request takes the key over. The retry reads the
// last recovery point with [interceptor.LastRecoveryPoint] and skips the
// steps already committed: after charge_sent it confirms the order with the
// saved charge id and never calls the provider.
//
// # Idempotent steps
//
// A recovery point is saved after its step's effect, so a crash between the
// two makes the retry repeat the step. Each step is therefore idempotent
// under the request's key: the reservation and the order are rows unique by
// the key, and the provider call carries the request's child key for
// [ChargeStep] (interceptor.ChildKey(ctx, ChargeStep)), attached by idem's
// client interceptor, so the provider answers a repeated call with the
// charge it already made. When an attempt fails with a transient error
// (the provider unreachable after the client's retries) after a recovery
// point, idem ends the lease but keeps the claim, so the retry takes over
// and resumes from that point too.
package checkoutsvc

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

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

// The recovery points Checkout saves, in the order it reaches them.
const (
	StepReserved        = "reserved"
	StepChargeSent      = "charge_sent"
	StepChargeConfirmed = "charge_confirmed"
)

// steps are the recovery points in order; "" is the start.
var steps = []string{"", StepReserved, StepChargeSent, StepChargeConfirmed}

// ChargeStep names the provider call: its idempotency key is
// interceptor.ChildKey(ctx, ChargeStep), derived from the Checkout
// request's tenant, method and key.
const ChargeStep = "charge"

// Points a [Hook] sees besides the steps.
const (
	// PointStarted: the handler runs; the detail is the recovery point it
	// resumes after, or "" when it starts afresh.
	PointStarted = "started"
	// PointChargeAnswered: the provider answered and StepChargeSent is not
	// saved yet. The detail is the charge id, followed by " replayed" when
	// the provider replayed an earlier answer.
	PointChargeAnswered = "charge_answered"
)

// Hook is called as Checkout reaches each point: [PointStarted], each step
// once its recovery point is durable (the detail is its payload), and
// [PointChargeAnswered]. It runs on the request's goroutine.
type Hook func(point, detail string)

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
	s := &Service{pool: pool, provider: provider, hook: func(string, string) {}}
	for _, opt := range opts {
		opt(s)
	}
	return s
}

// NewServer returns a gRPC server with svc registered behind panic recovery
// and idem on svc's database. Checkout's proto options put it in leased
// mode with a 2 s lease; opts may override them ([interceptor.WithLeased]).
func NewServer(svc *Service, opts ...interceptor.ServerOption) *grpc.Server {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Internal, "internal error")
		})),
		interceptor.UnaryServerInterceptor(postgres.New(svc.pool), opts...),
	))
	checkoutv1.RegisterCheckoutServiceServer(srv, svc)
	return srv
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
// resuming after the last step an earlier attempt under the same key
// committed. Too little stock fails it with FAILED_PRECONDITION, which idem
// records as the key's answer.
func (s *Service) Checkout(ctx context.Context, req *checkoutv1.CheckoutRequest) (*checkoutv1.CheckoutResponse, error) {
	if req.GetCustomerId() == "" || req.GetSku() == "" || req.GetQuantity() <= 0 ||
		req.GetUnitPriceCents() <= 0 || len(req.GetCurrency()) != 3 {
		return nil, status.Error(codes.InvalidArgument, "customer_id, sku, a positive quantity and unit price and a three-letter currency are required")
	}
	key, ok := interceptor.KeyFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "Checkout must run under the idem interceptor")
	}
	step, data, _ := interceptor.LastRecoveryPoint(ctx)
	reached := slices.Index(steps, step)
	if reached < 0 {
		return nil, status.Errorf(codes.Internal, "unknown recovery point %q", step)
	}
	s.hook(PointStarted, step)

	if reached < 1 {
		id, err := s.reserve(ctx, key, req)
		if err != nil {
			return nil, err
		}
		if err := s.save(ctx, StepReserved, id); err != nil {
			return nil, err
		}
	}

	var chargeID string
	switch {
	case reached < 2:
		id, err := s.charge(ctx, req)
		if err != nil {
			return nil, err
		}
		if err := s.save(ctx, StepChargeSent, id); err != nil {
			return nil, err
		}
		chargeID = id
	case reached == 2:
		// The charge was made and its id saved: the provider is not asked
		// again.
		chargeID = string(data)
		if chargeID == "" {
			return nil, status.Error(codes.Internal, "recovery point "+StepChargeSent+" holds no charge id")
		}
	}

	if reached < 3 {
		id, err := s.confirm(ctx, key, chargeID, req)
		if err != nil {
			return nil, err
		}
		if err := s.save(ctx, StepChargeConfirmed, id); err != nil {
			return nil, err
		}
	}
	return s.order(ctx, key)
}

// save makes step durable with payload and tells the hook. Its error is
// returned as it is: store.ErrLeaseLost tells idem that a retry has taken
// the key over.
func (s *Service) save(ctx context.Context, step, payload string) error {
	if err := interceptor.SaveRecoveryPoint(ctx, step, []byte(payload)); err != nil {
		return fmt.Errorf("saving recovery point %s: %w", step, err)
	}
	s.hook(step, payload)
	return nil
}

var errOutOfStock = errors.New("out of stock")

// reserve takes the request's quantity out of stock, once per key, and
// returns the reservation's id.
func (s *Service) reserve(ctx context.Context, key string, req *checkoutv1.CheckoutRequest) (string, error) {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO reservations (request_key, sku, quantity) VALUES ($1, $2, $3)
			ON CONFLICT (request_key) DO NOTHING`, key, req.GetSku(), req.GetQuantity())
		if err != nil || tag.RowsAffected() == 0 {
			return err // reserved already by an attempt that crashed before saving the step
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
	err = s.pool.QueryRow(ctx, `SELECT id::text FROM reservations WHERE request_key = $1`, key).Scan(&id)
	return id, err
}

// charge asks the provider for the request's amount and returns the charge
// id. The provider request depends on the checkout request alone, never on
// values generated along the way (such as the reservation id): a repeated
// call must be the same request under the same derived key, or the
// provider rejects it as a reused key.
func (s *Service) charge(ctx context.Context, req *checkoutv1.CheckoutRequest) (string, error) {
	var header metadata.MD
	resp, err := s.provider.Charge(interceptor.ContextWithStep(ctx, ChargeStep), &providerv1.ChargeRequest{
		CustomerId:  req.GetCustomerId(),
		AmountCents: int64(req.GetQuantity()) * req.GetUnitPriceCents(),
		Currency:    req.GetCurrency(),
	}, grpc.Header(&header))
	if err != nil {
		// A declining provider would also release the reservation here;
		// the stub only rejects requests that Checkout has validated.
		return "", err
	}
	detail := resp.GetChargeId()
	if len(header.Get(interceptor.ReplayedHeader)) > 0 {
		detail += " replayed"
	}
	s.hook(PointChargeAnswered, detail)
	return resp.GetChargeId(), nil
}

// confirm records the order paid with chargeID, once per key, and returns
// its id.
func (s *Service) confirm(ctx context.Context, key, chargeID string, req *checkoutv1.CheckoutRequest) (string, error) {
	if _, err := s.pool.Exec(ctx, `INSERT INTO orders (request_key, reservation_id, charge_id, amount_cents, currency)
		SELECT $1, r.id, $2, $3, $4 FROM reservations r WHERE r.request_key = $1
		ON CONFLICT (request_key) DO NOTHING`,
		key, chargeID, int64(req.GetQuantity())*req.GetUnitPriceCents(), req.GetCurrency()); err != nil {
		return "", err
	}
	var id string
	err := s.pool.QueryRow(ctx, `SELECT id::text FROM orders WHERE request_key = $1`, key).Scan(&id)
	return id, err
}

// order reads the confirmed order of key.
func (s *Service) order(ctx context.Context, key string) (*checkoutv1.CheckoutResponse, error) {
	resp := &checkoutv1.CheckoutResponse{}
	err := s.pool.QueryRow(ctx, `SELECT id::text, reservation_id::text, charge_id, amount_cents FROM orders WHERE request_key = $1`, key).
		Scan(&resp.OrderId, &resp.ReservationId, &resp.ChargeId, &resp.AmountCents)
	return resp, err
}
