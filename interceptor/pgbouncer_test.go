package interceptor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/pgtest"
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

// TestPgBouncerQueueEndsAtQueryWaitTimeout holds PgBouncer's only server
// connection with a call in flight: a call with another key waits in
// PgBouncer's queue, which idem's lock timeout does not bound, until
// query_wait_timeout, and is then answered UNAVAILABLE, having written
// nothing; once the first call is done the second runs.
func TestPgBouncerQueueEndsAtQueryWaitTimeout(t *testing.T) {
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: 1, QueryWaitTimeout: time.Second})
	e := newEnv(t, setup{database: func(t *testing.T) string { return b.NewDatabase(t) }})
	entered, release := make(chan struct{}), make(chan struct{})
	e.svc.setHook(func(_ context.Context, value string) error {
		if value == "hold" {
			close(entered)
			<-release
		}
		return nil
	})
	first := make(chan error, 1)
	go func() {
		_, err := e.client.Do(withKey("a"), &testv1.DoRequest{Value: "hold"})
		first <- err
	}()
	<-entered
	start := time.Now()
	_, err := e.client.Do(withKey("b"), &testv1.DoRequest{Value: "v"})
	waited := time.Since(start)
	wantCode(t, err, codes.Unavailable)
	if waited > 5*time.Second {
		t.Errorf("the queued call was answered after %v; query_wait_timeout is 1s", waited)
	}
	if !strings.Contains(e.log.String(), "query_wait_timeout") {
		t.Errorf("the server did not log PgBouncer's query_wait_timeout:\n%s", e.log.String())
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Do(withKey("b"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatalf("retry once the connection is free: %v", err)
	}
	if n := e.effects(t); n != 2 {
		t.Errorf("%d effect rows, want 2", n)
	}
}
