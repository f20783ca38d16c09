package pgtest_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
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

// A test that needs its own pool settings adjusts the configuration before
// opening the pool; it closes the pool itself, and the database is dropped
// after that, when the test ends.
func ExampleNewConfig() {
	testStore := func(t *testing.T) {
		cfg := pgtest.NewConfig(t)
		cfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close) // before the database is dropped
		st := postgres.New(pool)
		_ = st // exercise the store
	}
	_ = testStore
}
