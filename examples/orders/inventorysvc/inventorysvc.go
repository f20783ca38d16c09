// Package inventorysvc is the stub InventoryService of the orders example:
// Reserve writes a reservations row on the transaction that holds the
// request's idempotency key and records every execution, so tests can tell
// executions from replays.
package inventorysvc

import (
	"context"
	_ "embed"
	"slices"
	"sync"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	inventoryv1 "github.com/idemkit/idem/examples/gen/inventory/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

//go:embed schema.sql
var schema string

// Migrate applies idem's migrations and the reservations table to db.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	if err := postgres.Migrate(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, schema)
	return err
}

// NewServer returns a gRPC server with the idem interceptor and stub
// registered. Like the payments example, it reads the tenant from
// paymentsvc.TenantHeader.
func NewServer(pool *pgxpool.Pool, stub *Stub, opts ...idem.Option) (*grpc.Server, error) {
	engine, err := idem.New(postgres.New(pool), append([]idem.Option{idem.WithTenant(paymentsvc.TenantOf)}, opts...)...)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recovery.UnaryServerInterceptor(),
		interceptor.UnaryServerInterceptor(engine),
	))
	inventoryv1.RegisterInventoryServiceServer(srv, stub)
	return srv, nil
}

// Call is one execution of Reserve.
type Call struct {
	Key      string
	SKU      string
	Quantity int32
}

// Stub implements inventoryv1.InventoryServiceServer.
type Stub struct {
	inventoryv1.UnimplementedInventoryServiceServer

	mu    sync.Mutex
	calls []Call
}

// Calls returns the executions of Reserve so far, in order. Replays of a
// recorded response do not reach the stub and are not among them.
func (s *Stub) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// Reserve records a reservation on the transaction of the request's key.
func (s *Stub) Reserve(ctx context.Context, req *inventoryv1.ReserveRequest) (*inventoryv1.ReserveResponse, error) {
	if req.GetSku() == "" || req.GetQuantity() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "sku and a positive quantity are required")
	}
	tx, ok := postgres.TxFromContext(ctx)
	key, _ := idem.KeyFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "Reserve must run under the idem interceptor")
	}
	s.mu.Lock()
	s.calls = append(s.calls, Call{Key: key, SKU: req.GetSku(), Quantity: req.GetQuantity()})
	s.mu.Unlock()
	var id string
	if err := tx.QueryRow(ctx,
		`INSERT INTO reservations (sku, quantity, request_key) VALUES ($1, $2, $3) RETURNING id::text`,
		req.GetSku(), req.GetQuantity(), key).Scan(&id); err != nil {
		return nil, err
	}
	return &inventoryv1.ReserveResponse{ReservationId: id}, nil
}
