package readme

import (
	"context"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/inbox"
)

// The snippets of docs/pgbouncer.md and docs/shards.md. Their "..." lines
// stand for the error checks below them.

// serveBehindPgBouncer is docs/pgbouncer.md's server: the store through
// PgBouncer in transaction mode, pgx in exec mode.
func serveBehindPgBouncer(ctx context.Context) (*grpc.Server, error) {
	// postgres://app@pgbouncer.internal:6432/app?default_query_exec_mode=exec
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, err
	}
	engine, err := idem.New(postgres.New(pool))
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		interceptor.UnaryServerInterceptor(engine),
	))
	return srv, nil
}

// shardOfTenant stands for the application's own routing of a tenant.
func shardOfTenant(tenant string) int { return len(tenant) % 2 }

// message is a message of docs/shards.md's consumer.
type message struct {
	Tenant, ID string
}

// serveSharded is docs/shards.md's server, sweepers and inboxes over two
// shards.
func serveSharded(ctx context.Context, shard0, shard1 *pgxpool.Pool, msg message, apply func(pgx.Tx) error) (*grpc.Server, error) {
	shards := []*pgxpool.Pool{shard0, shard1}                         // each on its shard's primary
	route := func(tenant string) int { return shardOfTenant(tenant) } // an index into shards
	s := postgres.NewSharded(shards, route, postgres.WithLockTimeout(time.Second))
	engine, err := idem.New(s)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))

	for _, pool := range shards {
		go func() { _ = postgres.NewSweeper(pool).Run(ctx) }()
	}

	inboxes := make([]*inbox.Inbox, len(shards))
	for i, pool := range shards {
		inboxes[i] = inbox.New(pool, "ledger")
	}
	dup, err := inboxes[route(msg.Tenant)].ProcessOnce(ctx, msg.ID, apply)
	_ = dup
	return srv, err
}
