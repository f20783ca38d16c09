package readme

import (
	"context"
	"errors"
	"os"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

func newServer(ctx context.Context) (*grpc.Server, error) {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, err
	}
	if err := postgres.Migrate(ctx, pool); err != nil { // idem's tables
		return nil, err
	}
	store := postgres.New(pool)
	if err := store.Check(ctx); err != nil { // says now, not on the first call, if idem cannot serve
		return nil, err
	}
	engine, err := idem.New(store, idem.WithTenant(tenantFromAuth))
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(
			recovery.UnaryServerInterceptor(),
			interceptor.UnaryServerInterceptor(engine),
		),
		grpc.ChainStreamInterceptor(interceptor.StreamServerInterceptor()),
	)
	paymentsv1.RegisterPaymentServiceServer(srv, &server{})
	return srv, nil
}

// tenantFromAuth returns the caller's tenant. Derive it from the caller's
// verified identity (here a header an authenticating proxy sets), never
// only from a value the client chooses freely. header is the request
// metadata, lower-case names.
func tenantFromAuth(ctx context.Context, header map[string][]string) (string, error) {
	if v := header["x-authenticated-tenant"]; len(v) == 1 {
		return v[0], nil
	}
	return "", errors.New("no authenticated tenant")
}

// CreatePayment writes on the transaction that holds the key.
func (s *server) CreatePayment(ctx context.Context, req *paymentsv1.CreatePaymentRequest) (*paymentsv1.CreatePaymentResponse, error) {
	tx, _ := postgres.TxFromContext(ctx)
	var id string
	err := tx.QueryRow(ctx, `INSERT INTO payments (customer_id, amount_cents) VALUES ($1, $2) RETURNING id::text`,
		req.GetCustomerId(), req.GetAmountCents()).Scan(&id)
	if err != nil {
		return nil, err
	}
	return &paymentsv1.CreatePaymentResponse{Payment: &paymentsv1.Payment{Id: id}}, nil
}
