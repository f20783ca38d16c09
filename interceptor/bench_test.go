package interceptor_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// benchService inserts one row per call: on the claim's transaction under
// idem, in a transaction of its own without.
type benchService struct {
	testv1.UnimplementedTestServiceServer
	pool *pgxpool.Pool
}

func (s *benchService) Maybe(ctx context.Context, req *testv1.MaybeRequest) (*testv1.MaybeResponse, error) {
	const insert = `INSERT INTO effects (key, value) VALUES ($1, $2)`
	if tx, ok := postgres.TxFromContext(ctx); ok {
		if _, err := tx.Exec(ctx, insert, "", req.GetValue()); err != nil {
			return nil, err
		}
	} else {
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insert, "", req.GetValue())
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return &testv1.MaybeResponse{Value: req.GetValue()}, nil
}

// BenchmarkUnary compares, in one run, a call whose handler opens its own
// transaction (baseline), the same call under idem with a fresh key each
// time (first execution), and a retry of a completed key (replay).
//
//	go test -run '^$' -bench Unary -benchmem ./interceptor/
func BenchmarkUnary(b *testing.B) {
	pool := benchPool(b)
	client := benchServer(b, pool)
	req := &testv1.MaybeRequest{Value: "v"}
	if _, err := client.Maybe(withKey("done"), req); err != nil {
		b.Fatal(err)
	}

	var seq atomic.Int64
	for _, bc := range []struct {
		name string
		ctx  func() context.Context
	}{
		{"baseline", context.Background},
		{"first-execution", func() context.Context { return withKey(fmt.Sprint("k", seq.Add(1))) }},
		{"replay", func() context.Context { return withKey("done") }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(4) // 8 concurrent callers on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := client.Maybe(bc.ctx(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// benchPool returns a pool of 16 connections to a database of its own,
// with the table effects.
func benchPool(b *testing.B) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (id bigserial PRIMARY KEY, key text, value text)`); err != nil {
		b.Fatal(err)
	}
	return pool
}

// benchServer serves benchService under idem, with opts, on a store on
// pool, and returns a client of it.
func benchServer(b *testing.B, pool *pgxpool.Pool, opts ...idem.Option) testv1.TestServiceClient {
	srv := grpc.NewServer(grpc.UnaryInterceptor(interceptor.UnaryServerInterceptor(idemtest.NewEngine(b, postgres.New(pool), opts...))))
	testv1.RegisterTestServiceServer(srv, &benchService{pool: pool})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return testv1.NewTestServiceClient(conn)
}

// BenchmarkReplayCounts compares, in one run, replays of 1024 recorded
// keys in turn with the replays counted (the default: in memory, written
// in batches) and not (idem.WithReplayCounts(false)): what counting costs
// a replay, the batches' writes included.
//
//	go test -run '^$' -bench ReplayCounts -benchmem ./interceptor/
func BenchmarkReplayCounts(b *testing.B) {
	pool := benchPool(b)
	const keys = 1024
	req := &testv1.MaybeRequest{Value: "v"}
	for _, bc := range []struct {
		name    string
		counted bool
	}{{"counted", true}, {"uncounted", false}} {
		client := benchServer(b, pool, idem.WithReplayCounts(bc.counted))
		for i := range keys {
			if _, err := client.Maybe(withKey(fmt.Sprint(bc.name, i)), req); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(bc.name, func(b *testing.B) {
			var seq atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(4) // 8 concurrent callers on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := client.Maybe(withKey(fmt.Sprint(bc.name, seq.Add(1)%keys)), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
