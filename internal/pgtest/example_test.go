package pgtest_test

import (
	"context"
	"log"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// A test gets a pool on a database of its own, with idem's schema and no
// rows; the pool is closed and the database dropped when the test ends.
func ExampleNewPool() {
	testStore := func(t *testing.T) {
		pool := pgtest.NewPool(t)
		st := postgres.New(pool)

		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM idempotency_keys").Scan(&n); err != nil {
			t.Fatal(err)
		}
		_ = st // exercise the store; the test sees only its own keys
	}
	_ = testStore
}

// A program such as a demo starts PostgreSQL, or finds it, and runs on a
// database of its own.
func ExampleStart() {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		log.Fatal(err) // the message says how to get PostgreSQL
	}
	defer srv.Close() // stops a throwaway cluster

	connString, drop, err := srv.CreateDatabase(ctx)
	if err != nil {
		log.Print(err)
		return
	}
	defer drop(ctx)

	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		log.Print(err)
		return
	}
	defer pool.Close()
	st := postgres.New(pool)
	_ = st // serve with idem's interceptor
}
