package pgtest_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.Run(m))
}

// databaseExists reports whether pool's server has a database named name.
func databaseExists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var exists bool
	err := pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists)
	if err != nil {
		t.Fatal(err)
	}
	return exists
}

func TestNewConfig(t *testing.T) {
	observer := pgtest.NewPool(t)
	var name string
	t.Run("test", func(t *testing.T) {
		cfg := pgtest.NewConfig(t)
		name = cfg.ConnConfig.Database
		if name == "" || name == observer.Config().ConnConfig.Database {
			t.Fatalf("database %q, want a new one", name)
		}
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		// idem's schema is there, empty, and writable.
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("idempotency_keys has %d rows (%v), want an empty table", n, err)
		}
		if _, err := pool.Exec(t.Context(), `CREATE TABLE payments (id bigint)`); err != nil {
			t.Fatal(err)
		}
		if !databaseExists(t, observer, name) {
			t.Fatalf("database %s does not exist during the test", name)
		}
	})
	if databaseExists(t, observer, name) {
		t.Fatalf("database %s still exists after its test", name)
	}
}

func TestNewPool(t *testing.T) {
	observer := pgtest.NewPool(t)
	var pool *pgxpool.Pool
	t.Run("test", func(t *testing.T) {
		pool = pgtest.NewPool(t)
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("idempotency_keys has %d rows (%v), want an empty table", n, err)
		}
	})
	if _, err := pool.Acquire(context.Background()); err == nil {
		t.Fatal("the pool is still open after its test")
	}
	if name := pool.Config().ConnConfig.Database; databaseExists(t, observer, name) {
		t.Fatalf("database %s still exists after its test", name)
	}
}
