package interceptor_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/idemtest/grpctest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// testService implements TestService. Every execution of Do or Maybe
// inserts a row into effects on the claim's transaction (or on the pool
// when there is none), then calls hook, which decides the outcome.
type testService struct {
	testv1.UnimplementedTestServiceServer
	pool *pgxpool.Pool

	// arrived counts the calls that reached the server, before idem saw
	// them.
	arrived atomic.Int64

	mu         sync.Mutex
	executions int64
	hook       func(ctx context.Context, value string) error
}

func (s *testService) execute(ctx context.Context, value string) (int64, error) {
	s.mu.Lock()
	s.executions++
	n := s.executions
	hook := s.hook
	s.mu.Unlock()

	key, _ := idem.KeyFromContext(ctx)
	insert := `INSERT INTO effects (key, value) VALUES ($1, $2)`
	if s.pool == nil {
		// On store/memory there is no database: the effect is the
		// execution, which nothing can undo.
	} else if tx, ok := postgres.TxFromContext(ctx); ok {
		if _, err := tx.Exec(ctx, insert, key, value); err != nil {
			return 0, err
		}
	} else if _, err := s.pool.Exec(ctx, insert, key, value); err != nil {
		return 0, err
	}
	if hook != nil {
		if err := hook(ctx, value); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func (s *testService) Do(ctx context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	n, err := s.execute(ctx, req.GetValue())
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "23505" && req.GetTraceId() == "mapped" {
		return nil, status.Error(codes.AlreadyExists, "the effect exists")
	}
	if err != nil {
		return nil, err
	}
	return &testv1.DoResponse{
		Value:     req.GetValue(),
		Execution: n,
		// Several entries, so that map order would show in the bytes.
		Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"},
	}, nil
}

func (s *testService) Maybe(ctx context.Context, req *testv1.MaybeRequest) (*testv1.MaybeResponse, error) {
	n, err := s.execute(ctx, req.GetValue())
	if err != nil {
		return nil, err
	}
	return &testv1.MaybeResponse{Value: req.GetValue(), Execution: n}, nil
}

func (s *testService) Read(ctx context.Context, req *testv1.ReadRequest) (*testv1.ReadResponse, error) {
	n, err := s.execute(ctx, req.GetValue())
	if err != nil {
		return nil, err
	}
	return &testv1.ReadResponse{Value: req.GetValue(), Execution: n}, nil
}

// Renamed is Do under a scope and a TTL of its own.
func (s *testService) Renamed(ctx context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	return s.Do(ctx, req)
}

// Optimistic is Do in optimistic mode.
func (s *testService) Optimistic(ctx context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	return s.Do(ctx, req)
}

// Watch streams one response.
func (s *testService) Watch(req *testv1.DoRequest, stream grpc.ServerStreamingServer[testv1.DoResponse]) error {
	return stream.Send(&testv1.DoResponse{Value: req.GetValue()})
}

func (s *testService) setHook(h func(ctx context.Context, value string) error) {
	s.mu.Lock()
	s.hook = h
	s.mu.Unlock()
}

func (s *testService) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executions
}

type env struct {
	pool   *pgxpool.Pool
	svc    *testService
	client testv1.TestServiceClient
	// log holds what the interceptor logged.
	log *logBuffer
}

type setup struct {
	// memory runs the interceptor on store/memory, with no database at
	// all: the test runs under go test -short, and its effects are the
	// handler's executions.
	memory bool
	// memoryStore is the store/memory store of a memory setup; nil means a
	// new one.
	memoryStore store.Store
	// store builds the interceptor's store on the test's database; nil
	// means postgres.New(pool, storeOpts...).
	store     func(pool *pgxpool.Pool) store.Store
	storeOpts []postgres.Option
	opts      []idem.Option
	poolSize  int32
	tracer    pgx.QueryTracer
	// database returns the connection string of the test's database; nil
	// means pgtest.NewDatabase.
	database func(t *testing.T) string
}

// newEnv starts a gRPC server on a loopback port with the idem interceptor
// on a fresh database, and a client connected to it.
func newEnv(t *testing.T, s setup) *env {
	t.Helper()
	if s.memory {
		st := s.memoryStore
		if st == nil {
			st = memory.New()
		}
		return serveEnv(t, s, nil, st)
	}
	var dsn string
	if s.database != nil {
		dsn = s.database(t)
	} else {
		dsn = pgtest.NewDatabase(t)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	if s.poolSize > 0 {
		cfg.MaxConns = s.poolSize
	}
	cfg.ConnConfig.Tracer = s.tracer
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, key text, value text)`); err != nil {
		t.Fatal(err)
	}

	var st store.Store = postgres.New(pool, s.storeOpts...)
	if s.store != nil {
		st = s.store(pool)
	}
	return serveEnv(t, s, pool, st)
}

// serveEnv is newEnv once the store is built: pool is the test's database,
// nil on store/memory.
func serveEnv(t *testing.T, s setup, pool *pgxpool.Pool, st store.Store) *env {
	t.Helper()
	svc := &testService{pool: pool}
	log := &logBuffer{}
	e := idemtest.NewEngine(t, st, append([]idem.Option{idem.WithTenant(idemtest.TenantFromHeader), idem.WithLogger(log.logger())}, s.opts...)...)
	arrive := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		svc.arrived.Add(1)
		return h(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		arrive,
		recovery.UnaryServerInterceptor(),
		interceptor.UnaryServerInterceptor(e),
	), grpc.ChainStreamInterceptor(interceptor.StreamServerInterceptor()))
	testv1.RegisterTestServiceServer(srv, svc)
	conn := grpctest.Dial(t, grpctest.Start(t, srv))
	return &env{pool: pool, svc: svc, client: testv1.NewTestServiceClient(conn), log: log}
}

// logBuffer keeps what a logger wrote, for tests to search.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// logger returns a logger that writes every level to b as text.
func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// withKey returns a context whose outgoing metadata carries key.
func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), idem.KeyHeader, key)
}

// effects counts the handler's effects that stayed: rows of effects, or,
// on store/memory, its executions.
func (e *env) effects(t *testing.T) int {
	t.Helper()
	if e.pool == nil {
		return int(e.svc.count())
	}
	return e.countRows(t, `SELECT count(*) FROM effects`)
}

func (e *env) keys(t *testing.T) int {
	t.Helper()
	return e.countRows(t, `SELECT count(*) FROM idempotency_keys`)
}

func (e *env) countRows(t *testing.T, sql string, args ...any) int {
	t.Helper()
	if e.pool == nil {
		t.Fatal("counting rows needs the PostgreSQL store")
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantCode fails the test unless err carries code c.
func wantCode(t *testing.T, err error, c codes.Code) *status.Status {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != c {
		t.Fatalf("got %v, want code %v", err, c)
	}
	return st
}

func deadline(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// holdKeyRow inserts the row of key under method, for the empty tenant, in
// a transaction of a session outside idem on the database dsn, and keeps
// it open until rollback or the end of t: a claim of that key waits for
// its lock until then.
func holdKeyRow(t *testing.T, dsn, method, key string) (rollback func()) {
	t.Helper()
	ctx := context.Background()
	outside, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outside.Close(ctx) })
	if _, err := outside.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := outside.Exec(ctx, `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, expires_at)
		VALUES (`+pgtest.KeyIDSQL("''", "$1::text", "$2::text")+`, '', $1, $2, '\x00', now() + interval '1 hour')`,
		method, key); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if _, err := outside.Exec(ctx, `ROLLBACK`); err != nil {
			t.Fatal(err)
		}
	}
}
