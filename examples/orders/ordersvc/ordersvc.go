// Package ordersvc implements the example OrderService: PlaceOrder records
// an order on the transaction that holds the request's idempotency key and,
// while that transaction is open, reserves stock with InventoryService and
// takes payments with PaymentService. Its outbound calls go through idem's
// client interceptor, which gives each of them a key derived from the
// order's, so a retried PlaceOrder repeats the same keys and the downstream
// services replay instead of charging or reserving again.
package ordersvc

import (
	"context"
	_ "embed"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	inventoryv1 "github.com/idemkit/idem/examples/gen/inventory/v1"
	ordersv1 "github.com/idemkit/idem/examples/gen/orders/v1"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

//go:embed schema.sql
var schema string

// Migrate applies idem's migrations and the orders table to db.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	if err := postgres.Migrate(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, schema)
	return err
}

// ReserveStep is the step name of the stock reservation: its key is the
// order request's child key for it, idem.ChildKey(ctx, ReserveStep).
// The payments are not named, so their keys are derived from the method
// name and the call's ordinal (the first call to
// "/payments.v1.PaymentService/CreatePayment" for the goods, the second for
// the shipping).
const ReserveStep = "reserve-stock"

// ClientInterceptors returns the unary client interceptors for the
// connections to the services PlaceOrder calls, in chain order: idem first,
// so that the key is attached once, then retries of UNAVAILABLE and ABORTED
// (waiting as long as the server's RetryInfo asks), so that every attempt
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

// NewServer returns a gRPC server with the idem interceptor and the
// OrderService registered. Its tenant, like the payments example's, comes
// from paymentsvc.TenantHeader.
func NewServer(svc *Service, opts ...idem.Option) (*grpc.Server, error) {
	ics, err := ServerInterceptors(svc, opts...)
	if err != nil {
		return nil, err
	}
	return grpc.NewServer(grpc.ChainUnaryInterceptor(ics...)), nil
}

// ServerInterceptors returns the server chain of [NewServer]: recovery,
// then idem on the service's database.
func ServerInterceptors(svc *Service, opts ...idem.Option) ([]grpc.UnaryServerInterceptor, error) {
	engine, err := idem.New(postgres.New(svc.pool), append([]idem.Option{idem.WithTenant(paymentsvc.TenantOf)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return []grpc.UnaryServerInterceptor{
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Internal, "internal error")
		})),
		interceptor.UnaryServerInterceptor(engine),
	}, nil
}

// Service implements ordersv1.OrderServiceServer.
type Service struct {
	ordersv1.UnimplementedOrderServiceServer
	pool      *pgxpool.Pool
	payments  paymentsv1.PaymentServiceClient
	inventory inventoryv1.InventoryServiceClient
}

// New returns a Service that stores orders in pool and calls payments and
// inventory, whose connections must use [ClientInterceptors].
func New(pool *pgxpool.Pool, payments paymentsv1.PaymentServiceClient, inventory inventoryv1.InventoryServiceClient) *Service {
	return &Service{pool: pool, payments: payments, inventory: inventory}
}

// PlaceOrder records an order, reserves its stock and takes its payments.
// A failure anywhere rolls the order back and fails the call with the
// downstream error; the retry repeats the downstream calls with the same
// keys, and they answer with what they recorded.
func (s *Service) PlaceOrder(ctx context.Context, req *ordersv1.PlaceOrderRequest) (*ordersv1.PlaceOrderResponse, error) {
	if req.GetCustomerId() == "" || req.GetSku() == "" || req.GetQuantity() <= 0 || req.GetUnitPriceCents() <= 0 || req.GetShippingCents() < 0 {
		return nil, status.Error(codes.InvalidArgument, "customer_id, sku, a positive quantity and a positive unit price are required")
	}
	tx, ok := postgres.TxFromContext(ctx)
	key, _ := idem.KeyFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "PlaceOrder must run under the idem interceptor")
	}
	tenant, err := paymentsvc.Tenant(ctx)
	if err != nil {
		return nil, err
	}
	// The downstream services scope keys by the same tenant.
	out := metadata.AppendToOutgoingContext(ctx, paymentsvc.TenantHeader, tenant)

	o := &ordersv1.Order{CustomerId: req.GetCustomerId(), Sku: req.GetSku(), Quantity: req.GetQuantity()}
	if err := tx.QueryRow(ctx,
		`INSERT INTO orders (tenant_id, customer_id, sku, quantity, request_key)
		 VALUES ($1, $2, $3, $4, $5) RETURNING id::text`,
		tenant, o.CustomerId, o.Sku, o.Quantity, key).Scan(&o.Id); err != nil {
		return nil, err
	}

	reserveKey, _ := idem.ChildKey(ctx, ReserveStep)
	res, err := s.inventory.Reserve(idem.ContextWithKey(out, reserveKey),
		&inventoryv1.ReserveRequest{Sku: req.GetSku(), Quantity: req.GetQuantity()})
	if err != nil {
		return nil, err
	}
	o.ReservationId = res.GetReservationId()

	// Downstream requests depend only on this request, never on values
	// generated here (such as the order id): a retry must send the same
	// request with the same derived key, or it is rejected as a reused key.
	charges := []struct {
		cents int64
		note  string
	}{{int64(req.GetQuantity()) * req.GetUnitPriceCents(), "goods"}}
	if req.GetShippingCents() > 0 {
		charges = append(charges, struct {
			cents int64
			note  string
		}{req.GetShippingCents(), "shipping"})
	}
	for _, c := range charges {
		p, err := s.payments.CreatePayment(out, &paymentsv1.CreatePaymentRequest{
			CustomerId:  req.GetCustomerId(),
			AmountCents: c.cents,
			Currency:    req.GetCurrency(),
			Note:        c.note,
		})
		if err != nil {
			return nil, err
		}
		o.PaymentIds = append(o.PaymentIds, p.GetPayment().GetId())
	}

	if _, err := tx.Exec(ctx, `UPDATE orders SET reservation_id = $1, payment_ids = $2 WHERE id = $3`,
		o.ReservationId, o.PaymentIds, o.Id); err != nil {
		return nil, err
	}
	return &ordersv1.PlaceOrderResponse{Order: o}, nil
}
