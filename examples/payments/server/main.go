// Binary server demonstrates idem in a standalone gRPC server: PaymentService
// with the idem interceptor on PostgreSQL, plus gRPC health checking and
// server reflection.
//
//	go run ./examples/payments/server -listen 127.0.0.1:50051 -database-url postgres:///root
//
// Without -database-url it uses $DATABASE_URL, and without that the libpq
// defaults (PGHOST, PGPORT, PGUSER, PGDATABASE, the local socket): then the
// database is $PGDATABASE, or else the one named like the OS user. It
// creates its tables (payments, and idem's idempotency_keys and
// processed_messages) in that database at start, and logs which database it
// is; give it a database of its own. The tenant comes from the x-tenant-id
// header, a stand-in for real authentication.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/store/postgres"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:50051", "address to serve gRPC on")
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL connection string (default $DATABASE_URL, else the libpq defaults)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, lis, *dbURL); err != nil {
		log.Fatal(err)
	}
}

// run serves PaymentService on lis until ctx ends, then stops gracefully.
func run(ctx context.Context, lis net.Listener, dbURL string) error {
	defer lis.Close()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cc := pool.Config().ConnConfig
	log.Printf("payments server: creating its tables in database %q on %s (set -database-url to choose another)", cc.Database, cc.Host)
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		return err
	}
	// Say now, not on the first call, if idem cannot serve.
	if err := postgres.New(pool).Check(ctx); err != nil {
		return err
	}
	srv := paymentsvc.NewServer(pool)
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Printf("payments server listening on %s", lis.Addr())
	return srv.Serve(lis)
}
