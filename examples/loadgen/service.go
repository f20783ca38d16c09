package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/fingerprint"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

// insertPayment is paymentsvc's business insert, word for word.
const insertPayment = `INSERT INTO payments (tenant_id, customer_id, amount_cents, currency, note, request_key)
		 VALUES ($1, $2, $3, $4, $5, $6)
		 RETURNING id::text, created_at`

// payments is CreatePayment as paymentsvc implements it (the same checks
// and, with the payment handler, the same insert), with the writes of
// handler, and it also runs where no claim transaction is in the context:
// on the transaction of the naive interceptor below, or, with neither, on
// a transaction of its own on the pool (pgx.BeginFunc: BEGIN, the
// handler's statements, COMMIT). The baseline scenario is that last case
// without idem, the leased scenario the same case under idem in leased
// mode, where the claim has committed before the handler runs.
type payments struct {
	paymentsv1.UnimplementedPaymentServiceServer
	pool    *pgxpool.Pool
	handler *handler
}

var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

func (s *payments) CreatePayment(ctx context.Context, req *paymentsv1.CreatePaymentRequest) (*paymentsv1.CreatePaymentResponse, error) {
	if req.GetCustomerId() == "" || req.GetAmountCents() <= 0 || !currencyCode.MatchString(req.GetCurrency()) {
		return nil, status.Error(codes.InvalidArgument, "invalid payment")
	}
	tenant, err := paymentsvc.Tenant(ctx)
	if err != nil {
		return nil, err
	}
	// Without idem the key still names the payment: the table's
	// UNIQUE (tenant_id, request_key) wants one.
	key := metadata.ValueFromIncomingContext(ctx, idem.KeyHeader)
	if len(key) != 1 {
		return nil, status.Error(codes.InvalidArgument, "missing "+idem.KeyHeader)
	}
	p := &paymentsv1.Payment{
		CustomerId:  req.GetCustomerId(),
		AmountCents: req.GetAmountCents(),
		Currency:    req.GetCurrency(),
	}
	insert := func(tx pgx.Tx) error {
		id, created, err := s.handler.write(ctx, tx, tenant, key[0], req)
		p.Id = id
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
			return status.Error(codes.AlreadyExists, "a payment with this idempotency key exists")
		}
		p.CreateTime = timestamppb.New(created)
		return err
	}
	if tx, ok := postgres.TxFromContext(ctx); ok {
		err = insert(tx)
	} else if tx, ok := ctx.Value(naiveTxKey{}).(pgx.Tx); ok {
		err = insert(tx)
	} else {
		err = pgx.BeginFunc(ctx, s.pool, insert)
	}
	if err != nil {
		return nil, err
	}
	return &paymentsv1.CreatePaymentResponse{Payment: p}, nil
}

// recoveryInterceptor is the one paymentsvc.NewServer chains before idem, so
// that every server in the comparison runs the same chain apart from the
// interceptor under test.
func recoveryInterceptor() grpc.UnaryServerInterceptor {
	return recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
		return status.Error(codes.Internal, "internal error")
	}))
}

// newPlainServer serves payments with handler h behind the recovery
// interceptor and, when extra is not nil, extra.
func newPlainServer(pool *pgxpool.Pool, h *handler, extra grpc.UnaryServerInterceptor) *grpc.Server {
	chain := []grpc.UnaryServerInterceptor{recoveryInterceptor()}
	if extra != nil {
		chain = append(chain, extra)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	paymentsv1.RegisterPaymentServiceServer(srv, &payments{pool: pool, handler: h})
	return srv
}

// newIdemServer serves payments with handler h behind the recovery
// interceptor and idem, as paymentsvc.NewServer chains them: an engine on
// a postgres.Store of pool, with paymentsvc's tenant and then opts. Without
// opts CreatePayment runs in atomic mode, its writes on the claim's
// transaction.
func newIdemServer(pool *pgxpool.Pool, h *handler, opts ...idem.Option) (*grpc.Server, error) {
	engine, err := idem.New(postgres.New(pool), append([]idem.Option{idem.WithTenant(paymentsvc.TenantOf)}, opts...)...)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recoveryInterceptor(),
		interceptor.UnaryServerInterceptor(engine),
	))
	paymentsv1.RegisterPaymentServiceServer(srv, &payments{pool: pool, handler: h})
	return srv, nil
}

// newLeasedServer is newIdemServer with CreatePayment in leased mode: the
// claim commits on its own, the handler writes in its own transaction, and
// the outcome is recorded by an UPDATE of its own. The lease is far above
// any request's latency, so no heartbeat runs during a request.
func newLeasedServer(pool *pgxpool.Pool, h *handler) (*grpc.Server, error) {
	return newIdemServer(pool, h, idem.WithMethodPolicy(createPayment, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: 60 * time.Second})) // idem's default lease
}

// newAtomicServer is newIdemServer with CreatePayment in atomic mode,
// named, whatever the default mode.
func newAtomicServer(pool *pgxpool.Pool, h *handler) (*grpc.Server, error) {
	return newIdemServer(pool, h, idem.WithMethodPolicy(createPayment, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeAtomic}))
}

// newAutoServer is newIdemServer with CreatePayment in auto mode: a first
// attempt claimed as in optimistic mode, a retry as in atomic mode.
func newAutoServer(pool *pgxpool.Pool, h *handler) (*grpc.Server, error) {
	return newIdemServer(pool, h, idem.WithMethodPolicy(createPayment, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeAuto}))
}

// newOptimisticServer is newIdemServer with CreatePayment in optimistic
// mode.
func newOptimisticServer(pool *pgxpool.Pool, h *handler) (*grpc.Server, error) {
	return newIdemServer(pool, h, idem.WithMethodPolicy(createPayment, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic}))
}

type naiveTxKey struct{}

// naive is the textbook idempotency interceptor that idem is measured
// against: a key table of the textbook shape (naiveSchema, the shape idem's
// had before its narrow primary key), the same checks as idem, but every
// statement its own round trip —
//
//	BEGIN; SET LOCAL lock_timeout; INSERT claim; (handler); UPDATE record; COMMIT
//
// and, for a key that is taken, SELECT the entry and ROLLBACK. It keeps only
// the happy path of idem's semantics: every handler error rolls back.
type naive struct {
	pool           *pgxpool.Pool
	hasher         *fingerprint.Hasher
	setLockTimeout string
}

// lockTimeout is the PostgreSQL store's default lock timeout, as
// postgres.WithLockTimeout documents it, so that naive waits as long.
const lockTimeout = 2 * time.Second

func newNaive(pool *pgxpool.Pool) *naive {
	return &naive{
		pool:           pool,
		hasher:         fingerprint.NewHasher(),
		setLockTimeout: fmt.Sprintf("SET LOCAL lock_timeout = %d", lockTimeout.Milliseconds()),
	}
}

// naiveSchema is naive's key table: a row inserted by the claim and updated
// by the record, under a primary key of tenant, method and key.
const naiveSchema = `CREATE TABLE IF NOT EXISTS naive_keys (
    tenant        text        NOT NULL,
    method        text        NOT NULL,
    key           text        NOT NULL,
    request_hash  bytea       NOT NULL,
    status        text        NOT NULL DEFAULT 'in_progress',
    response_code integer,
    response      bytea,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant, method, key)
);
CREATE INDEX IF NOT EXISTS naive_keys_expires_at_idx ON naive_keys (expires_at)`

const (
	naiveClaim = `INSERT INTO naive_keys (tenant, method, key, request_hash, expires_at)
VALUES ($1, $2, $3, $4, now() + interval '24 hours')
ON CONFLICT (tenant, method, key) DO NOTHING
RETURNING true`
	naiveSelect = `SELECT status, request_hash, response
FROM naive_keys
WHERE tenant = $1 AND method = $2 AND key = $3 AND expires_at > now()`
	naiveRecord = `UPDATE naive_keys
SET status = 'recorded', response_code = 0, response = $4, updated_at = now()
WHERE tenant = $1 AND method = $2 AND key = $3 AND status = 'in_progress'`
)

func (n *naive) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	key := metadata.ValueFromIncomingContext(ctx, idem.KeyHeader)
	if len(key) != 1 {
		return handler(ctx, req)
	}
	tenant, err := paymentsvc.Tenant(ctx)
	if err != nil {
		return nil, err
	}
	fp, err := n.hasher.Sum(req.(proto.Message))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	tx, err := n.pool.Begin(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, n.setLockTimeout); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	var claimed bool
	err = tx.QueryRow(ctx, naiveClaim, tenant, info.FullMethod, key[0], fp).Scan(&claimed)
	if errors.Is(err, pgx.ErrNoRows) {
		return n.replay(ctx, tx, tenant, info.FullMethod, key[0], fp)
	}
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp, err = handler(context.WithValue(ctx, naiveTxKey{}, tx), req)
	if err != nil {
		return nil, err
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp.(proto.Message))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if _, err := tx.Exec(ctx, naiveRecord, tenant, info.FullMethod, key[0], body); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return resp, nil
}

func (n *naive) replay(ctx context.Context, tx pgx.Tx, tenant, method, key string, fp []byte) (any, error) {
	var (
		st         string
		hash, body []byte
	)
	err := tx.QueryRow(ctx, naiveSelect, tenant, method, key).Scan(&st, &hash, &body)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, status.Error(codes.Aborted, "key expired; retry")
	case err != nil:
		return nil, status.Error(codes.Unavailable, err.Error())
	case !bytes.Equal(hash, fp):
		return nil, status.Error(codes.FailedPrecondition, "idempotency key reused with another request")
	case st != "recorded":
		return nil, status.Error(codes.Aborted, "idempotency key in use")
	}
	resp := new(paymentsv1.CreatePaymentResponse)
	if err := proto.Unmarshal(body, resp); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(idem.ReplayedHeader, "true"))
	return resp, nil
}
