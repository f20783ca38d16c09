package interceptor_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/store/postgres/pgtest"
)

// TestPgBouncerConcurrentDuplicates runs the concurrency cases through
// PgBouncer in transaction mode, whose pool of two server connections per
// database is smaller than the interceptor's pool and far smaller than the
// concurrent callers: every case still executes each key once, and the
// server sees no more connections than PgBouncer's pool.
func TestPgBouncerConcurrentDuplicates(t *testing.T) {
	const serverConns = 2
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: serverConns})
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, s setup)
	}{
		{"200 callers on 16 connections", func(t *testing.T, s setup) {
			s.poolSize = 16
			concurrentDuplicatesExecuteOnce(t, newEnv(t, s))
		}},
		{"20 callers", func(t *testing.T, s setup) {
			e := newEnv(t, s)
			concurrentDuplicatesRunOnce(t, e)
			if n := e.effects(t); n != 1 {
				t.Errorf("%d effect rows, want 1", n)
			}
		}},
		{"duplicate in flight", duplicateInFlightGetsAborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var direct string
			tc.run(t, setup{database: func(t *testing.T) string {
				direct = pgtest.NewDatabase(t)
				dsn, err := b.ConnString(direct)
				if err != nil {
					t.Fatal(err)
				}
				return dsn
			}})
			// PgBouncer keeps its server connections open after use.
			conn, err := pgx.Connect(context.Background(), direct)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			var n int
			err = conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 || n > serverConns {
				t.Errorf("the database had %d other connections, want PgBouncer's 1 to %d", n, serverConns)
			}
		})
	}
}
