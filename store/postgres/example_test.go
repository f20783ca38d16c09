package postgres_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	s := postgres.New(pool,
		postgres.WithLockTimeout(500*time.Millisecond), // duplicates give up sooner
		postgres.WithTTL(72*time.Hour),                 // clients retry for up to three days
	)
	_ = grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(s)))
}

func ExampleTxFromContext() {
	// A handler's writes join the transaction that holds the key.
	createOrder := func(ctx context.Context, customer string) error {
		tx, ok := postgres.TxFromContext(ctx)
		if !ok {
			return pgx.ErrTxClosed // not under the interceptor
		}
		// A nested transaction is a savepoint: it may fail on its own.
		return pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders (customer) VALUES ($1)`, customer)
			return err
		})
	}
	_ = createOrder
}

func ExampleNewSweeper() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	sw := postgres.NewSweeper(pool,
		postgres.WithSweepInterval(5*time.Minute), // expired rows may wait a little longer
		postgres.WithSweepBatchSize(500),          // shorter transactions
	)
	// Every replica may run one. Failed passes are logged and retried;
	// Run returns ctx.Err() once ctx ends.
	go func() { _ = sw.Run(ctx) }()

	// ... serve until interrupted ...
	<-ctx.Done()
}
