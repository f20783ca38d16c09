package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	internalpgtest "github.com/idemkit/idem/internal/pgtest"
)

// NewConfig creates a database for tb alone, with idem's schema applied by
// [github.com/idemkit/idem/store/postgres.Migrate] and no rows, and returns
// a pool configuration for it, parsed by pgxpool.ParseConfig: adjust it,
// then open a pool with pgxpool.NewWithConfig. The database is dropped,
// along with any connections still open to it, when tb and its subtests
// have finished. Register the pool's Close with tb.Cleanup after calling
// NewConfig, so that the pool closes first.
//
// The server is found on first use in the process (see the package
// documentation). When no PostgreSQL can be had, NewConfig fails tb with a
// message that says how to get it; it never skips for that. Under go test
// -short it skips tb, so that the quick run leaves out every test that
// needs a database.
func NewConfig(tb testing.TB) *pgxpool.Config {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(internalpgtest.NewDatabase(tb))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return cfg
}

// NewPool opens a pool on [NewConfig]'s database: a new database of tb's
// own, with idem's schema and no rows. The pool is closed when tb has
// finished, before the database is dropped.
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), NewConfig(tb))
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	// Cleanups run last-registered first, so the pool closes before
	// NewConfig's cleanup drops the database.
	tb.Cleanup(pool.Close)
	return pool
}

// Run runs the tests of m and then stops the throwaway cluster that
// [NewConfig] started, if it started one. It returns the exit code for
// os.Exit, and is meant for TestMain:
//
//	func TestMain(m *testing.M) {
//		os.Exit(pgtest.Run(m))
//	}
//
// If stopping the cluster fails, Run reports it on standard error and turns
// a passing run into a failing one.
func Run(m *testing.M) int { return internalpgtest.Run(m) }
