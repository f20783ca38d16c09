package chaos

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// The tests in this file run the payments server with its database URL
// pointing at PgBouncer in transaction mode (pgtest.NewPgBouncer), in the
// exec mode of pgx that PgBouncer before 1.21 needs, which the URL asks for
// (default_query_exec_mode=exec). PgBouncer's pool has two server
// connections, fewer than the server's pool of four and far fewer than the
// clients. The checks are those of the tests they reuse, on the rows.

// bouncerConns is PgBouncer's pool: server connections per database.
const bouncerConns = 2

// bouncedDatabase returns a new database through b, and straight to
// PostgreSQL.
func bouncedDatabase(t *testing.T, b *pgtest.PgBouncer) (through, direct string) {
	t.Helper()
	direct = pgtest.NewDatabase(t)
	through, err := b.ConnString(direct)
	if err != nil {
		t.Fatal(err)
	}
	return through, direct
}

// checkServerConns fails t unless the database direct had between one and
// bouncerConns connections other than the check's own: PgBouncer keeps its
// server connections open after use, so more would mean that something
// bypassed it or that it opened more than its pool.
func checkServerConns(t *testing.T, direct string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || n > bouncerConns {
		t.Errorf("the database had %d other connections, want PgBouncer's 1 to %d", n, bouncerConns)
	}
}

// TestPgBouncerDuplicateStorm is TestDuplicateStorm through PgBouncer, in 4
// rounds, one turn of its kinds (quick, slow, quick, stuck).
func TestPgBouncerDuplicateStorm(t *testing.T) {
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: bouncerConns})
	through, direct := bouncedDatabase(t, b)
	s := startInProcessOn(t, through, stormPoolSize, postgres.WithLockTimeout(stormLockTimeout))
	duplicateStorm(t, s, 4)
	checkServerConns(t, direct)
}

// TestPgBouncerCrashAnywhere is TestCrashAnywhere through PgBouncer, with
// 80 payments and 4 kills: a server killed in a transaction leaves
// PgBouncer a server connection in the middle of it, which must not carry
// the transaction, or its locks, to the next client.
func TestPgBouncerCrashAnywhere(t *testing.T) {
	forEachMode(t, func(t *testing.T, flags []string) {
		b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: bouncerConns})
		through, direct := bouncedDatabase(t, b)
		crashAnywhere(t, through, 80, 4, flags...)
		checkServerConns(t, direct)
	})
}

// TestPgBouncerCrashAfterCommit is TestCrashAfterCommit through PgBouncer.
func TestPgBouncerCrashAfterCommit(t *testing.T) {
	forEachMode(t, func(t *testing.T, flags []string) {
		b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: bouncerConns})
		through, direct := bouncedDatabase(t, b)
		crashAfterCommit(t, through, flags...)
		checkServerConns(t, direct)
	})
}
