package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/internal/pgtest"
)

// observerApp is the application_name of the test's own connections, which
// the faults spare.
const observerApp = "idem-chaos-observer"

// TestTerminateBackends cuts every PostgreSQL connection of the payments
// server with pg_terminate_backend, 12 times while 16 clients drive 240
// payments. Connections die idle, inside a claim, inside the handler and
// around COMMIT; the server replaces them without a restart of its own.
func TestTerminateBackends(t *testing.T) {
	forEachMode(t, terminateBackends)
}

// terminateBackends is TestTerminateBackends with the server started with
// flags.
func terminateBackends(t *testing.T, flags []string) {
	const (
		numOps     = 240
		numClients = 16
		numRounds  = 12
	)
	dsn := pgtest.NewDatabase(t)
	srv := startServer(t, binary(t, serverPkg), dsn, flags...)
	pool := observerPool(t, dsn)
	dropBackstop(t, pool)
	pid := srv.pid()

	l := &load{
		ops:   newOps(numOps, 10),
		conns: clients(t, srv.addr, numClients),
	}
	var terminated []int
	for range numRounds {
		l.faults = append(l.faults, func(int) {
			var n int
			err := pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
				FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name <> $1`,
				observerApp).Scan(&n)
			if err != nil {
				t.Errorf("terminate the server's connections: %v", err)
			}
			terminated = append(terminated, n)
		})
	}
	l.run(t)
	t.Logf("server connections terminated per round: %v", terminated)

	if sum := sumInts(terminated); sum < numRounds {
		t.Errorf("%d server connections terminated in %d rounds; the fault did not bite", sum, numRounds)
	}
	if !srv.running() || srv.pid() != pid {
		t.Errorf("the server process changed (%s); it must recover on its own", srv.exitState())
	}
	checkInvariants(t, pool, l.ops)
	l.checkCodes(t, codes.OK, codes.InvalidArgument, codes.Unavailable, codes.Aborted)
	checkStorageErrors(t, l, srv)
}

// TestPostgresRestart crashes and restarts a PostgreSQL cluster the test
// owns (pg_ctl stop -m immediate, then start), 4 times while 16 clients
// drive 200 payments. Transactions in flight are lost, committed ones are
// recovered from the write-ahead log, and the server reconnects without a
// restart of its own.
func TestPostgresRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	forEachMode(t, postgresRestart)
}

// postgresRestart is TestPostgresRestart with the server started with
// flags.
func postgresRestart(t *testing.T, flags []string) {
	const (
		numOps      = 200
		numClients  = 16
		numRestarts = 4
	)
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cluster, err := pgtest.StartCluster(startCtx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Close(); err != nil {
			t.Error(err)
		}
	})
	dsn, _, err := cluster.CreateDatabase(startCtx)
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, binary(t, serverPkg), dsn, flags...)
	pool := observerPool(t, dsn)
	dropBackstop(t, pool)
	pid := srv.pid()

	l := &load{
		ops:   newOps(numOps, 10),
		conns: clients(t, srv.addr, numClients),
	}
	restarts := 0
	for range numRestarts {
		l.faults = append(l.faults, func(int) {
			start := time.Now()
			if err := cluster.Restart(ctx); err != nil {
				t.Fatalf("restart PostgreSQL: %v", err)
			}
			restarts++
			t.Logf("PostgreSQL restarted in %v", time.Since(start).Round(time.Millisecond))
		})
	}
	l.run(t)

	if restarts != numRestarts {
		t.Fatalf("%d restarts, want %d", restarts, numRestarts)
	}
	if !srv.running() || srv.pid() != pid {
		t.Errorf("the server process changed (%s); it must recover on its own", srv.exitState())
	}
	pool.Reset() // its connections died with the last restart
	checkInvariants(t, pool, l.ops)
	l.checkCodes(t, codes.OK, codes.InvalidArgument, codes.Unavailable, codes.Aborted)
	checkStorageErrors(t, l, srv)
}

// checkStorageErrors fails t if an UNAVAILABLE answer of l carried the
// database's text, or if the server logged fewer of idem's storage failures,
// each with its error, than clients were told about.
func checkStorageErrors(t *testing.T, l *load, srv *serverProc) {
	t.Helper()
	const failed = "idem: storage failed"
	told := l.checkNoStorageText(t, failed)
	logged := 0
	for _, line := range strings.Split(srv.output.String(), "\n") {
		if strings.Contains(line, failed) && strings.Contains(line, " error=") {
			logged++
		}
	}
	if logged < told {
		t.Errorf("clients were told of %d storage failures, the server logged %d with their errors", told, logged)
	}
	t.Logf("storage failures: %d answers, %d log lines", told, logged)
}

// observerPool opens the test's own pool on dsn, marked so that the faults
// spare it.
func observerPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = observerApp
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func sumInts(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// TestTableLock calls CreatePayment while another transaction holds a lock
// on idempotency_keys (LOCK TABLE, or a migration's ALTER TABLE), on a
// payments server process that has just started and on one that has served
// a payment. Both must give up after idem's lock timeout (2 s) with
// ABORTED and IDEMPOTENCY_KEY_IN_USE, not hold the call and a connection
// until the client's deadline; and both serve the key once the lock is
// gone, with one payment.
func TestTableLock(t *testing.T) {
	for _, warm := range []bool{false, true} {
		name := "new server"
		if warm {
			name = "server that has served"
		}
		t.Run(name, func(t *testing.T) {
			dsn := pgtest.NewDatabase(t)
			srv := startServer(t, binary(t, serverPkg), dsn)
			pool := observerPool(t, dsn)
			conn := dial(t, srv.addr)
			t.Cleanup(func() { conn.Close() })
			client := paymentsv1.NewPaymentServiceClient(conn)
			call := func(key string) (*paymentsv1.CreatePaymentResponse, error) {
				ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
				defer cancel()
				ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs(keyed("acme", key)...))
				return client.CreatePayment(ctx, payment)
			}
			if warm {
				if _, err := call("warm"); err != nil {
					t.Fatal(err)
				}
			}

			ctx := context.Background()
			lock, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer lock.Rollback(ctx)
			if _, err := lock.Exec(ctx, `LOCK TABLE idempotency_keys IN SHARE ROW EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			// attemptTimeout (15 s) is far above the lock timeout: a wait
			// that nothing bounds ends in DEADLINE_EXCEEDED instead.
			_, err = call("k")
			st := wantCode(t, err, codes.Aborted)
			if info := errorInfo(st); info.GetReason() != idem.ReasonKeyInUse {
				t.Fatalf("ErrorInfo %v, want %s", info, idem.ReasonKeyInUse)
			}
			if err := lock.Rollback(ctx); err != nil {
				t.Fatal(err)
			}

			resp, err := call("k")
			if err != nil {
				t.Fatalf("after the lock was released: %v", err)
			}
			var n int
			var id string
			err = pool.QueryRow(ctx, `SELECT count(*) OVER (), id::text FROM payments WHERE request_key = 'k'`).Scan(&n, &id)
			if err != nil || n != 1 || id != resp.GetPayment().GetId() {
				t.Fatalf("%d payments for the key, id %q (%v); want one, %q", n, id, err, resp.GetPayment().GetId())
			}
		})
	}
}
