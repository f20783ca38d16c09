package interceptor_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// TestRecordBehindUncommittedKeyRowAnswersInUse calls a key whose row a
// session outside idem has inserted and not committed: the claim cannot
// see the row, so the handler runs, and its record then meets the row.
// The call must be answered ABORTED IDEMPOTENCY_KEY_IN_USE with RetryInfo
// after about the lock timeout, with the other session still open, and
// keep none of the handler's writes; once the session rolls back, a retry
// executes once and the next replays. Directly and through PgBouncer.
func TestRecordBehindUncommittedKeyRowAnswersInUse(t *testing.T) {
	const lockTimeout = 200 * time.Millisecond
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: 2})
	for _, bounced := range []bool{false, true} {
		name := "direct"
		if bounced {
			name = "pgbouncer"
		}
		t.Run(name, func(t *testing.T) {
			var direct string
			e := newEnv(t, setup{
				storeOpts: []postgres.Option{postgres.WithLockTimeout(lockTimeout)},
				opts:      []idem.Option{idem.WithRetryDelay(1500 * time.Millisecond)},
				database: func(t *testing.T) string {
					direct = pgtest.NewDatabase(t)
					if !bounced {
						return direct
					}
					dsn, err := b.ConnString(direct)
					if err != nil {
						t.Fatal(err)
					}
					return dsn
				},
			})
			// The tenant of the calls below is "" (no x-tenant-id).
			rollback := holdKeyRow(t, direct, doMethod, "k")

			// A generous deadline: a record that waits without a bound
			// ends here, DEADLINE_EXCEEDED.
			cctx, cancel := context.WithTimeout(withKey("k"), 10*time.Second)
			defer cancel()
			start := time.Now()
			_, err := e.client.Do(cctx, &testv1.DoRequest{Value: "v"})
			waited := time.Since(start)
			st := wantCode(t, err, codes.Aborted)
			if info := errorInfo(st); info.GetReason() != idem.ReasonKeyInUse || info.GetDomain() != idem.Domain {
				t.Fatalf("ErrorInfo %v, want reason %s", info, idem.ReasonKeyInUse)
			}
			if d := retryDelay(err); d == nil || *d != 1500*time.Millisecond {
				t.Fatalf("RetryInfo delay %v, want 1.5s", d)
			}
			if waited > 25*lockTimeout {
				t.Errorf("answered after %v with a lock timeout of %v", waited, lockTimeout)
			}
			if n, x := e.effects(t), e.svc.count(); n != 0 || x != 1 {
				t.Fatalf("with the other session open: %d effect rows and %d executions, want 0 and 1", n, x)
			}

			rollback()
			if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
				t.Fatalf("retry once the other session rolled back: %v", err)
			}
			var header metadata.MD
			if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header)); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
				t.Fatalf("second retry: %v, header %v; want a replay", err, header)
			}
			if n, x := e.effects(t), e.svc.count(); n != 1 || x != 2 {
				t.Fatalf("after the retries: %d effect rows and %d executions, want 1 and 2", n, x)
			}
			if n := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE key = 'k' AND status = 'recorded'`); n != 1 {
				t.Fatalf("%d completed rows for the key, want 1", n)
			}
		})
	}
}
