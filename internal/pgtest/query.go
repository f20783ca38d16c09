package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Count runs sql, a query of one integer, on pool and returns it, failing
// tb when the query fails.
func Count(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return n
}

// lockWaitLimit bounds WaitForLockWait.
const lockWaitLimit = 2 * time.Minute

// WaitForLockWait waits until a session of pool's database waits for a
// lock, and fails tb naming who should be waiting if none does within two
// minutes.
func WaitForLockWait(tb testing.TB, pool *pgxpool.Pool, who string) {
	tb.Helper()
	deadline := time.Now().Add(lockWaitLimit)
	for Count(tb, pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		if time.Now().After(deadline) {
			tb.Fatalf("gave up waiting for %s to wait for a lock", who)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
