// Package providersvc is the stub payment provider of the checkout example.
// Charge runs behind idem's server interceptor in atomic mode: the charges
// row is written on the transaction that holds the request's idempotency
// key, so a retry with the same key gets the first charge back instead of a
// second one. The stub also remembers every Charge call that reached it,
// replays included, so that tests can tell how often it was asked.
package providersvc

import (
	"context"
	_ "embed"
	"slices"
	"sync"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	providerv1 "github.com/idemkit/idem/examples/gen/provider/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

//go:embed schema.sql
var schema string

// Migrate applies idem's migrations and the charges table to db.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	if err := postgres.Migrate(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, schema)
	return err
}

// NewServer returns a gRPC server with stub registered behind, in chain
// order, the stub's log of calls, panic recovery and idem on pool.
func NewServer(pool *pgxpool.Pool, stub *Stub, opts ...idem.Option) (*grpc.Server, error) {
	engine, err := idem.New(postgres.New(pool), opts...)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		stub.logCall,
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Internal, "internal error")
		})),
		interceptor.UnaryServerInterceptor(engine),
	))
	providerv1.RegisterProviderServiceServer(srv, stub)
	return srv, nil
}

// Call is one Charge call as it reached the provider, before idem.
type Call struct {
	// Key is the call's idempotency key.
	Key string
	// Code is the call's outcome.
	Code codes.Code
}

// Stub implements providerv1.ProviderServiceServer.
type Stub struct {
	providerv1.UnimplementedProviderServiceServer

	mu    sync.Mutex
	calls []Call
}

// Calls returns the Charge calls that reached the provider so far, in
// order: executions and replays alike. The charges table holds the
// executions.
func (s *Stub) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// CallsWithKey returns how many Charge calls carried key.
func (s *Stub) CallsWithKey(key string) int {
	n := 0
	for _, c := range s.Calls() {
		if c.Key == key {
			n++
		}
	}
	return n
}

// logCall is a server interceptor, first in the chain, that records every
// call with its key and outcome.
func (s *Stub) logCall(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var key string
	if v := metadata.ValueFromIncomingContext(ctx, idem.KeyHeader); len(v) == 1 {
		key = v[0]
	}
	resp, err := handler(ctx, req)
	s.mu.Lock()
	s.calls = append(s.calls, Call{Key: key, Code: status.Code(err)})
	s.mu.Unlock()
	return resp, err
}

// Charge records a charge on the transaction of the request's key.
func (s *Stub) Charge(ctx context.Context, req *providerv1.ChargeRequest) (*providerv1.ChargeResponse, error) {
	if req.GetCustomerId() == "" || req.GetAmountCents() <= 0 || len(req.GetCurrency()) != 3 {
		return nil, status.Error(codes.InvalidArgument, "customer_id, a positive amount and a three-letter currency are required")
	}
	tx, ok := postgres.TxFromContext(ctx)
	key, _ := idem.KeyFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "Charge must run under the idem interceptor")
	}
	resp := &providerv1.ChargeResponse{AmountCents: req.GetAmountCents(), Currency: req.GetCurrency()}
	if err := tx.QueryRow(ctx,
		`INSERT INTO charges (request_key, customer_id, amount_cents, currency) VALUES ($1, $2, $3, $4) RETURNING id`,
		key, req.GetCustomerId(), req.GetAmountCents(), req.GetCurrency()).Scan(&resp.ChargeId); err != nil {
		return nil, err
	}
	return resp, nil
}
