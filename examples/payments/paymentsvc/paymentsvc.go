// Package paymentsvc implements the example PaymentService: CreatePayment
// records a payment on the transaction that holds the request's idempotency
// key, so a retried call never charges twice.
package paymentsvc

import (
	"context"
	_ "embed"
	"errors"
	"hash/fnv"
	"log/slog"
	"net/textproto"
	"regexp"
	"slices"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemgateway"
	"github.com/idemkit/idem/store/postgres"
)

//go:embed schema.sql
var schema string

// Migrate applies idem's migrations and the payments table to db.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	if err := postgres.Migrate(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, schema)
	return err
}

// TenantHeader is the metadata key the example reads the tenant from. It is
// a stand-in for real authentication: a production server takes the tenant
// from the caller's verified identity, never from a header the client picks.
const TenantHeader = "x-tenant-id"

// TenantHTTPHeader is the HTTP header of the gateway ([NewGateway]) that it
// forwards as [TenantHeader]; the same stand-in.
const TenantHTTPHeader = "X-Tenant-Id"

// Tenant returns the caller's tenant from [TenantHeader].
func Tenant(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	return TenantOf(ctx, md)
}

// TenantOf returns the tenant of a call from [TenantHeader] in its request
// metadata, header: idem's tenant ([idem.WithTenant]).
func TenantOf(_ context.Context, header map[string][]string) (string, error) {
	v := header[TenantHeader]
	if len(v) != 1 || v[0] == "" {
		return "", status.Error(codes.Unauthenticated, "missing "+TenantHeader+" header")
	}
	return v[0], nil
}

// NewServer returns a gRPC server with the idem interceptor, PaymentService,
// health checking and server reflection registered. It fails when opts
// name a method that is not a unary method of a registered service.
func NewServer(pool *pgxpool.Pool, opts ...idem.Option) (*grpc.Server, error) {
	return newServer(postgres.New(pool), New(pool), opts)
}

// NewShardedServer is [NewServer] for tenants spread over several databases,
// the shards: a tenant's idempotency keys and payments live on
// shards[ShardOf(tenant, len(shards))], and each CreatePayment claims its
// key and inserts the payment in one transaction there. Every shard needs
// the schema ([Migrate]).
func NewShardedServer(shards []*pgxpool.Pool, opts ...idem.Option) (*grpc.Server, error) {
	route := func(tenant string) int { return ShardOf(tenant, len(shards)) }
	return newServer(postgres.NewSharded(shards, route), NewSharded(shards), opts)
}

// ShardOf returns the index of tenant's shard among n: the FNV-1a hash of
// the tenant, modulo n. It is stable, so a tenant keeps its shard for as
// long as n stays the same; changing n moves most tenants, which a real
// deployment avoids with a directory of tenants and their shards.
func ShardOf(tenant string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(n))
}

func newServer(st *postgres.Store, svc *Service, opts []idem.Option) (*grpc.Server, error) {
	engine, err := idem.New(st, append([]idem.Option{idem.WithTenant(TenantOf)}, opts...)...)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		// A panic releases the idempotency key inside idem, then becomes
		// INTERNAL here, without the stack trace the default handler sends.
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Internal, "internal error")
		})),
		interceptor.UnaryServerInterceptor(engine),
	), grpc.ChainStreamInterceptor(interceptor.StreamServerInterceptor()))
	paymentsv1.RegisterPaymentServiceServer(srv, svc)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)
	return srv, nil
}

// NewGateway returns a grpc-gateway ServeMux that serves PaymentService as
// HTTP/JSON (POST /v1/payments, GET /v1/payments/{id}) by calling it over
// conn, so that the gRPC server's idem interceptor runs for HTTP requests
// too: with idemgateway's options, the client's Idempotency-Key header
// becomes the call's idempotency-key, a replay carries Idempotent-Replayed:
// true, and idem's refusals are problem details. [TenantHTTPHeader] is
// forwarded as [TenantHeader].
func NewGateway(ctx context.Context, conn *grpc.ClientConn) (*runtime.ServeMux, error) {
	mux := runtime.NewServeMux(append(idemgateway.ServeMuxOptions(),
		runtime.WithIncomingHeaderMatcher(idemgateway.IncomingHeaderMatcher(gatewayHeader)))...)
	if err := paymentsv1.RegisterPaymentServiceHandler(ctx, mux, conn); err != nil {
		return nil, err
	}
	return mux, nil
}

// gatewayHeader forwards [TenantHTTPHeader], and the other headers as
// grpc-gateway does by default.
func gatewayHeader(key string) (string, bool) {
	if textproto.CanonicalMIMEHeaderKey(key) == TenantHTTPHeader {
		return TenantHeader, true
	}
	return runtime.DefaultHeaderMatcher(key)
}

// Service implements paymentsv1.PaymentServiceServer on PostgreSQL.
type Service struct {
	paymentsv1.UnimplementedPaymentServiceServer
	shards []*pgxpool.Pool // a tenant's payments are on shards[ShardOf(tenant, len(shards))]
}

// New returns a Service that reads payments from pool. Writes go through the
// transaction of the request's idempotency key.
func New(pool *pgxpool.Pool) *Service { return &Service{shards: []*pgxpool.Pool{pool}} }

// NewSharded returns a Service that reads a tenant's payments from its
// shard, shards[ShardOf(tenant, len(shards))]. Writes go through the
// transaction of the request's idempotency key, which is on that shard too
// (see [NewShardedServer]).
func NewSharded(shards []*pgxpool.Pool) *Service {
	return &Service{shards: slices.Clone(shards)}
}

var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

// CreatePayment records a payment. It runs only under the idem interceptor,
// which hands it the transaction that holds the idempotency key.
func (s *Service) CreatePayment(ctx context.Context, req *paymentsv1.CreatePaymentRequest) (*paymentsv1.CreatePaymentResponse, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	tx, ok := postgres.TxFromContext(ctx)
	key, _ := idem.KeyFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "CreatePayment must run under the idem interceptor")
	}
	tenant, err := Tenant(ctx)
	if err != nil {
		return nil, err
	}
	p := &paymentsv1.Payment{
		CustomerId:  req.GetCustomerId(),
		AmountCents: req.GetAmountCents(),
		Currency:    req.GetCurrency(),
	}
	var created time.Time
	err = tx.QueryRow(ctx,
		`INSERT INTO payments (tenant_id, customer_id, amount_cents, currency, note, request_key)
		 VALUES ($1, $2, $3, $4, $5, $6)
		 RETURNING id::text, created_at`,
		tenant, p.CustomerId, p.AmountCents, p.Currency, req.GetNote(), key,
	).Scan(&p.Id, &created)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
		return nil, status.Error(codes.AlreadyExists, "a payment with this idempotency key exists")
	}
	if err != nil {
		// A lost connection or a failed statement: nothing was stored, and
		// the retry may succeed. The database's error stays in the log.
		slog.ErrorContext(ctx, "storing a payment failed", "tenant", tenant, "error", err)
		return nil, unavailable("storing the payment failed; retry")
	}
	p.CreateTime = timestamppb.New(created)
	return &paymentsv1.CreatePaymentResponse{Payment: p}, nil
}

// GetPayment reads a payment of the caller's tenant.
func (s *Service) GetPayment(ctx context.Context, req *paymentsv1.GetPaymentRequest) (*paymentsv1.GetPaymentResponse, error) {
	tenant, err := Tenant(ctx)
	if err != nil {
		return nil, err
	}
	p := &paymentsv1.Payment{}
	var created time.Time
	pool := s.shards[ShardOf(tenant, len(s.shards))]
	err = pool.QueryRow(ctx,
		`SELECT id::text, customer_id, amount_cents, currency, created_at
		 FROM payments WHERE tenant_id = $1 AND id::text = $2`,
		tenant, req.GetId(),
	).Scan(&p.Id, &p.CustomerId, &p.AmountCents, &p.Currency, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, status.Error(codes.NotFound, "no such payment")
	}
	if err != nil {
		slog.ErrorContext(ctx, "reading a payment failed", "tenant", tenant, "error", err)
		return nil, unavailable("reading the payment failed; retry")
	}
	p.CreateTime = timestamppb.New(created)
	return &paymentsv1.GetPaymentResponse{Payment: p}, nil
}

// retryDelay is the delay the service's UNAVAILABLE answers suggest, as
// idem's own do (idem.WithRetryDelay, 1 s by default).
const retryDelay = time.Second

// unavailable is an UNAVAILABLE error with msg and a RetryInfo of
// retryDelay: during a failover the database refuses calls for seconds,
// and clients that read the delay (interceptor.RetryDelay) come back after
// it instead of at once, as they do after idem's own UNAVAILABLE.
func unavailable(msg string) error {
	st, err := status.New(codes.Unavailable, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelay)})
	if err != nil {
		return status.Error(codes.Unavailable, msg)
	}
	return st.Err()
}

func validate(req *paymentsv1.CreatePaymentRequest) error {
	var violations []*errdetails.BadRequest_FieldViolation
	if req.GetCustomerId() == "" {
		violations = append(violations, &errdetails.BadRequest_FieldViolation{Field: "customer_id", Description: "must not be empty"})
	}
	if req.GetAmountCents() <= 0 {
		violations = append(violations, &errdetails.BadRequest_FieldViolation{Field: "amount_cents", Description: "must be positive"})
	}
	if !currencyCode.MatchString(req.GetCurrency()) {
		violations = append(violations, &errdetails.BadRequest_FieldViolation{Field: "currency", Description: "must be an ISO 4217 code such as EUR"})
	}
	if len(violations) == 0 {
		return nil
	}
	st, err := status.New(codes.InvalidArgument, "invalid payment").WithDetails(&errdetails.BadRequest{FieldViolations: violations})
	if err != nil {
		return status.Error(codes.InvalidArgument, "invalid payment")
	}
	return st.Err()
}
