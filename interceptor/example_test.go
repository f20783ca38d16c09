package interceptor_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

func ExampleUnaryServerInterceptor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	e, err := idem.New(postgres.New(pool))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		interceptor.UnaryServerInterceptor(e),
	))
	_ = srv // register services, then srv.Serve(listener)
}
