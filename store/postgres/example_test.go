package postgres_test

import (
	"context"
	"hash/fnv"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/inbox"
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
	engine, err := idem.New(s)
	if err != nil {
		log.Fatal(err)
	}
	_ = grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))
}

func ExampleStore_FlushReplays() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	s := postgres.New(pool)
	engine, err := idem.New(s)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))
	// ... srv.Serve(lis) until interrupted ...
	<-ctx.Done()
	srv.GracefulStop()
	// The replays counted since the last batch, before the pool closes.
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.FlushReplays(fctx); err != nil {
		log.Printf("the last replays' counts were not written: %v", err)
	}
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
		postgres.WithInterval(5*time.Minute), // expired rows may wait a little longer
		postgres.WithBatchSize(500),          // shorter transactions
	)
	// Every replica may run one. Failed passes are logged and retried;
	// Run returns ctx.Err() once ctx ends.
	go func() { _ = sw.Run(ctx) }()

	// ... serve until interrupted ...
	<-ctx.Done()
}

func ExampleNewSharded() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// One pool per shard, each on its database's primary. Every shard gets
	// idem's schema (and the application's tables) and a sweeper.
	var shards []*pgxpool.Pool
	for _, url := range []string{os.Getenv("SHARD0_URL"), os.Getenv("SHARD1_URL")} {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			log.Fatal(err)
		}
		defer pool.Close()
		if err := postgres.Migrate(ctx, pool); err != nil {
			log.Fatal(err)
		}
		go func() { _ = postgres.NewSweeper(pool).Run(ctx) }()
		shards = append(shards, pool)
	}
	// A stable route: the same tenant always gets the same shard. (A
	// directory table that names each tenant's shard lets tenants move.)
	route := func(tenant string) int {
		h := fnv.New32a()
		h.Write([]byte(tenant))
		return int(h.Sum32() % uint32(len(shards)))
	}
	s := postgres.NewSharded(shards, route)
	if err := s.Check(ctx); err != nil { // every shard is ready
		log.Fatal(err)
	}
	// Handlers write through postgres.TxFromContext: the transaction is on
	// the caller's shard.
	engine, err := idem.New(s)
	if err != nil {
		log.Fatal(err)
	}
	_ = grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))

	// A consumer records each message on the shard whose data it changes.
	inboxes := make([]*inbox.Inbox, len(shards))
	for i, pool := range shards {
		inboxes[i] = inbox.New(pool, "ledger")
	}
	apply := func(ctx context.Context, tenant, messageID string) error {
		_, err := inboxes[route(tenant)].ProcessOnce(ctx, messageID, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE tenant = $1`, tenant)
			return err
		})
		return err
	}
	_ = apply
}

// The sweeper reports to the meter and tracer providers it is given.
func ExampleWithMeterProvider() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	sw := postgres.NewSweeper(pool,
		postgres.WithMeterProvider(otel.GetMeterProvider()), // your SDK's provider
		postgres.WithInterval(5*time.Minute))
	_ = sw.Run(ctx) // until interrupted
}
