package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// holdTableLock takes lock (a mode of LOCK TABLE) on idempotency_keys in a
// transaction of its own, as an operator or a migration's ALTER TABLE
// would, and returns the function that ends it.
func holdTableLock(t *testing.T, dsn, lock string) (release func()) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "BEGIN; LOCK TABLE idempotency_keys IN "+lock+" MODE"); err != nil {
		t.Fatal(err)
	}
	release = rollbackAndClose(conn)
	t.Cleanup(release)
	return release
}

// rollbackAndClose returns the function that ends conn's transaction,
// waiting for the server to have rolled it back (a connection closed
// with its transaction open is rolled back too, but after Close has
// returned), and closes conn. It may be called more than once.
func rollbackAndClose(conn *pgx.Conn) func() {
	return func() {
		if !conn.IsClosed() {
			_, _ = conn.Exec(ctx, "ROLLBACK")
		}
		_ = conn.Close(ctx)
	}
}

// TestClaimBehindTableLockIsBounded claims keys while another transaction
// holds a lock on idempotency_keys: every claim, atomic or leased, must give
// up with store.ErrInUse after the lock timeout, on a connection that has
// never claimed (a server that just started, a new or recycled connection
// of the pool) as on one that has, in every QueryExecMode. A claim that
// failed so leaves the connection's statement cache invalidated; the next
// one must be bounded too.
func TestClaimBehindTableLockIsBounded(t *testing.T) {
	const lockTimeout = 300 * time.Millisecond
	type testCase struct {
		name string
		mode pgx.QueryExecMode
		lock string
		warm bool
	}
	var cases []testCase
	for _, mode := range execModes {
		cases = append(cases,
			testCase{mode.String() + "/new connection", mode, "SHARE ROW EXCLUSIVE", false},
			testCase{mode.String() + "/warm connection", mode, "SHARE ROW EXCLUSIVE", true})
	}
	cases = append(cases,
		testCase{"cache_statement/new connection/access exclusive", pgx.QueryExecModeCacheStatement, "ACCESS EXCLUSIVE", false},
		testCase{"cache_describe/new connection/access exclusive", pgx.QueryExecModeCacheDescribe, "ACCESS EXCLUSIVE", false})

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := pgtest.NewDatabase(t)
			pool := newPool(t, dsn, tc.mode)
			// The connection exists, as a server's does once it has
			// migrated at start, but has claimed nothing yet.
			if err := pool.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			s := postgres.New(pool, postgres.WithLockTimeout(lockTimeout))
			if tc.warm {
				claimAndRecord(t, s, store.Scope{Tenant: "t", Method: "/svc/M", Key: "warm"})
			}

			claimsGiveUpBehindTableLock(t, s, pool, dsn, tc.lock, lockTimeout)

			// An optimistic claim reaches the table first at its record,
			// on a connection that has claimed before or never has.
			if !tc.warm {
				pool = newPool(t, dsn, tc.mode)
				s = postgres.New(pool, postgres.WithLockTimeout(lockTimeout))
			}
			newWTable(t, pool)
			optimisticRecordsGiveUpBehindTableLock(t, s, pool, dsn, tc.lock, lockTimeout)
		})
	}
}

// claimsGiveUpBehindTableLock holds lock on idempotency_keys on a
// connection of its own to lockDSN, and checks that claims and leases of s,
// twice each, and the writes of a lease taken before the lock (extend,
// save a step, record), give up with store.ErrInUse rather than wait; then
// it lets the lock go and checks that key is claimed and completed once,
// and the lease recorded, counting their rows through pool.
func claimsGiveUpBehindTableLock(t *testing.T, s *postgres.Store, pool *pgxpool.Pool, lockDSN, lock string, lockTimeout time.Duration) {
	t.Helper()
	leased := store.Scope{Tenant: "t", Method: "/svc/M", Key: "leased-before-the-lock"}
	lc, err := s.ClaimLeased(ctx, leased, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease before the table lock: %+v, %v", lc, err)
	}
	release := holdTableLock(t, lockDSN, lock)
	// Far longer than the lock timeout: an unbounded wait ends here, with
	// context.DeadlineExceeded instead of ErrInUse.
	cctx, cancel := context.WithTimeout(ctx, 20*lockTimeout)
	defer cancel()
	for i := range 2 {
		if _, err := s.Claim(cctx, key, store.ClaimRequest{Fingerprint: []byte("fp")}); !errors.Is(err, store.ErrInUse) {
			t.Fatalf("claim %d behind the table lock: %v, want ErrInUse", i+1, err)
		}
		if _, err := s.ClaimLeased(cctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute}); !errors.Is(err, store.ErrInUse) {
			t.Fatalf("lease %d behind the table lock: %v, want ErrInUse", i+1, err)
		}
	}
	for _, w := range []struct {
		name  string
		write func(ctx context.Context) error
	}{
		{"extend", func(ctx context.Context) error { return lc.Lease.Extend(ctx, time.Hour) }},
		{"save", func(ctx context.Context) error {
			return lc.Lease.SaveStep(ctx, store.Step{Name: "charge", Result: []byte("ch_1")})
		}},
		{"record", func(ctx context.Context) error {
			return lc.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")})
		}},
	} {
		cctx, cancel := context.WithTimeout(ctx, 20*lockTimeout)
		err := w.write(cctx)
		cancel()
		if !errors.Is(err, store.ErrInUse) {
			t.Fatalf("lease %s behind the table lock: %v, want ErrInUse", w.name, err)
		}
	}

	release()
	claimAndRecord(t, s, key)
	if err := lc.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
		t.Fatalf("record of the lease once the lock is gone: %v", err)
	}
	var n, recorded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE key = $1), count(*) FILTER (WHERE key = $2 AND step_names IS NULL)
		FROM idempotency_keys WHERE status = 'recorded'`, key.Key, leased.Key).Scan(&n, &recorded); err != nil || n != 1 || recorded != 1 {
		t.Fatalf("%d recorded rows for the key and %d for the lease without a step (%v), want 1 each", n, recorded, err)
	}
}

// claimAndRecord claims k in atomic mode, and k's leased twin (its key
// with "-lease" appended) in leased mode, and completes both.
func claimAndRecord(t *testing.T, s *postgres.Store, k store.Scope) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := s.Claim(cctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim of %s: %+v, %v", k.Key, c, err)
	}
	if err := c.Txn.Record(cctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	k.Key += "-lease"
	l, err := s.ClaimLeased(cctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || l.Lease == nil {
		t.Fatalf("lease of %s: %+v, %v", k.Key, l, err)
	}
	if err := l.Lease.Record(cctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
}

// TestClaimRoundTrips counts the round trips on the wire of claims on one
// connection, and of the records that follow them, in every QueryExecMode:
// bounding the lock waits of a connection's first claim, and those of
// every record, must cost nothing once the connection has claimed and
// recorded, except where pgx describes statements before a batch. It pins
// what sendBounded relies on in pgx:
//
//   - in exec and simple_protocol, a batch is one round trip, the first on a
//     connection too;
//   - in cache_statement, a statement prepared with Conn.Prepare (its SQL as
//     its name) runs from a batch that queues its SQL with no round trip
//     more, Prepare of it with a context that has ended answers whether it
//     is prepared without sending anything, and it stays prepared after a
//     batch that failed: a warm claim is one round trip, and the first
//     claim after one that failed behind a table lock prepares nothing
//     again but the statements without a table that pgx's own cache drops
//     then (a round trip to deallocate them, one to prepare them);
//   - in cache_describe, pgx keeps a statement's description once it has
//     described it: a warm claim is the transaction's BEGIN and then one
//     batch, two round trips;
//   - in describe_exec, pgx describes every batch's statements in a round
//     trip of their own, inside the transaction begun before: three.
func TestClaimRoundTrips(t *testing.T) {
	// Round trips of an atomic claim, its record, a leased claim and its
	// record.
	type trips [4]int64
	for _, tc := range []struct {
		mode                pgx.QueryExecMode
		first, second, warm trips
		afterFailed         int64 // the atomic claim after one that failed
	}{
		// The second claim prepares the BEGIN of the batch that the
		// first, which begins its transaction on its own, did not send.
		{pgx.QueryExecModeCacheStatement, trips{4, 2, 4, 3}, trips{2, 1, 1, 1}, trips{1, 1, 1, 1}, 3},
		{pgx.QueryExecModeCacheDescribe, trips{3, 2, 3, 3}, trips{2, 1, 2, 2}, trips{2, 1, 2, 2}, 3},
		{pgx.QueryExecModeDescribeExec, trips{3, 2, 3, 3}, trips{3, 2, 3, 3}, trips{3, 2, 3, 3}, 3},
		{pgx.QueryExecModeExec, trips{1, 1, 1, 1}, trips{1, 1, 1, 1}, trips{1, 1, 1, 1}, 1},
		{pgx.QueryExecModeSimpleProtocol, trips{1, 1, 1, 1}, trips{1, 1, 1, 1}, trips{1, 1, 1, 1}, 1},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			t.Parallel()
			dsn := pgtest.NewDatabase(t)
			pool, n := countingPool(t, dsn, tc.mode)
			s := postgres.New(pool, postgres.WithLockTimeout(300*time.Millisecond))
			count := func(f func() error) int64 {
				t.Helper()
				before := n.Load()
				if err := f(); err != nil {
					t.Fatal(err)
				}
				return n.Load() - before
			}
			var got []trips
			for i := range 3 {
				k := store.Scope{Tenant: "t", Method: "/svc/M", Key: fmt.Sprint("k", i)}
				var (
					tr trips
					c  store.Claim
					l  store.LeasedClaim
				)
				tr[0] = count(func() (err error) {
					if c, err = s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")}); err == nil && c.Txn == nil {
						err = fmt.Errorf("claim of a new key: %+v", c)
					}
					return err
				})
				tr[1] = count(func() error { return c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}) })
				k.Key += "-lease"
				tr[2] = count(func() (err error) {
					if l, err = s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute}); err == nil && l.Lease == nil {
						err = fmt.Errorf("lease of a new key: %+v", l)
					}
					return err
				})
				tr[3] = count(func() error { return l.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}) })
				got = append(got, tr)
			}

			// A claim that fails behind a table lock, on the same
			// connection, and the next one.
			release := holdTableLock(t, dsn, "SHARE ROW EXCLUSIVE")
			if _, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")}); !errors.Is(err, store.ErrInUse) {
				t.Fatalf("claim behind the table lock: %v, want ErrInUse", err)
			}
			release()
			var c store.Claim
			afterFailed := count(func() (err error) {
				c, err = s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
				return err
			})
			if err := c.Txn.Release(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("round trips of an atomic claim, its record, a leased claim and its record, three times: %v; "+
				"of a claim after one that failed: %d", got, afterFailed)
			if got[0] != tc.first {
				t.Errorf("the first claims and records took %v round trips, want %v", got[0], tc.first)
			}
			if got[1] != tc.second {
				t.Errorf("the second claims and records took %v round trips, want %v", got[1], tc.second)
			}
			if got[2] != tc.warm {
				t.Errorf("warm claims and records took %v round trips, want %v", got[2], tc.warm)
			}
			if afterFailed != tc.afterFailed {
				t.Errorf("the claim after one that failed took %d round trips, want %d", afterFailed, tc.afterFailed)
			}
		})
	}
}

// countingPool returns a pool of one connection to dsn, in mode, connected
// already, and the count of round trips on its socket.
func countingPool(t *testing.T, dsn string, mode pgx.QueryExecMode) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	n := new(atomic.Int64)
	cfg.ConnConfig.AfterNetConnect = func(_ context.Context, _ *pgconn.Config, conn net.Conn) (net.Conn, error) {
		return &tripConn{Conn: conn, trips: n}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	return pool, n
}

// tripConn counts round trips: a write that follows a read, or comes
// first, starts one.
type tripConn struct {
	net.Conn
	trips *atomic.Int64
	wrote atomic.Bool
}

func (c *tripConn) Write(p []byte) (int, error) {
	if !c.wrote.Swap(true) {
		c.trips.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *tripConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.wrote.Store(false)
	}
	return n, err
}

// holdKeyRow runs sql, with args, in a transaction of its own on dsn and
// keeps the transaction open, as a session outside idem's lock would (an
// application's, an operator's, a script's): an INSERT of a key's row not
// yet committed, a SELECT … FOR UPDATE of it. It returns the function that
// rolls the transaction back.
func holdKeyRow(t *testing.T, dsn, sql string, args ...any) (release func()) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	release = rollbackAndClose(conn)
	t.Cleanup(release)
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
	return release
}

// Statements of the key-row tests: the outside session's insert of a key's
// row (in progress, as a claim of another system's would leave it), the
// committed row of a key that expired, and the outside session's lock of a
// key's row. $1 to $3 are the key's tenant, method and key.
var (
	insertKeyRow = `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, expires_at)
		VALUES (` + pgtest.KeyIDSQL("$1::text", "$2::text", "$3::text") + `, $1, $2, $3, '\x00', now() + interval '1 hour')`
	insertExpiredRow = `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, expires_at)
		VALUES (` + pgtest.KeyIDSQL("$1::text", "$2::text", "$3::text") + `, $1, $2, $3, '\x00', 'recorded', 0, now() - interval '1 hour')`
	lockKeyRow = `SELECT FROM idempotency_keys WHERE tenant = $1 AND method = $2 AND key = $3 FOR UPDATE`
)

// TestRecordBehindLockedKeyRowIsBounded records the outcome of a claim
// whose key's row another session holds locked outside idem's lock: a row
// it inserted and has not committed (the claim cannot see it, so it owns
// the key and runs the handler), or an expired row it locked (the claim
// takes it over). The record, a success or a recorded error, must give up
// with store.ErrInUse after the lock timeout, commit nothing, and leave
// the key to a retry once the other session is gone; and so must leased
// mode's writes (extend, save a step, record, release) behind a row lock.
// In every QueryExecMode.
func TestRecordBehindLockedKeyRowIsBounded(t *testing.T) {
	const lockTimeout = 300 * time.Millisecond
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			dsn := pgtest.NewDatabase(t)
			pool := newPool(t, dsn, mode)
			s := postgres.New(pool, postgres.WithLockTimeout(lockTimeout))
			recordsGiveUpBehindLockedKeyRow(t, s, pool, dsn, lockTimeout, false)
			recordsGiveUpBehindLockedKeyRow(t, s, pool, dsn, lockTimeout, true)
			leaseWritesGiveUpBehindLockedKeyRow(t, s, pool, dsn, lockTimeout)
		})
	}
}

// recordsGiveUpBehindLockedKeyRow checks the records of s behind a key's
// row that a session of its own on lockDSN holds, reading rows through
// pool, which must have a table w; of optimistic claims, which read
// nothing, if optimistic is set.
func recordsGiveUpBehindLockedKeyRow(t *testing.T, s *postgres.Store, pool *pgxpool.Pool, lockDSN string, lockTimeout time.Duration, optimistic bool) {
	t.Helper()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS w (key text)`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		takeover bool // the row is committed, expired, and locked
		code     code.Code
	}{
		{"uncommitted insert/success", false, code.Code_OK},
		{"uncommitted insert/recorded error", false, code.Code_INVALID_ARGUMENT},
		{"locked expired row/success", true, code.Code_OK},
		{"locked expired row/recorded error", true, code.Code_INVALID_ARGUMENT},
	} {
		k := store.Scope{Tenant: "t", Method: "/svc/M", Key: fmt.Sprintf("%s/optimistic=%t", tc.name, optimistic)}
		args := []any{k.Tenant, k.Method, k.Key}
		// run claims k, optimistically or not, writes a row of w and
		// records tc.code.
		run := func(ctx context.Context, optimistic bool) error {
			t.Helper()
			c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp"), Optimistic: optimistic})
			if err != nil || c.Txn == nil {
				t.Fatalf("%s: claim: %+v, %v; want to own the key", tc.name, c, err)
			}
			defer func() { _ = c.Txn.Release(ctx) }()
			tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
			if _, err := tx.Exec(ctx, `INSERT INTO w VALUES ($1)`, k.Key); err != nil {
				t.Fatal(err)
			}
			return c.Txn.Record(ctx, store.Outcome{Code: tc.code, Body: []byte("r")})
		}
		rows := func() (writes, completed int) {
			t.Helper()
			err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM w WHERE key = $3),
				(SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND method = $2 AND key = $3
					AND status = 'recorded' AND expires_at > now())`, args...).Scan(&writes, &completed)
			if err != nil {
				t.Fatal(err)
			}
			return writes, completed
		}

		var release func()
		if tc.takeover {
			if _, err := pool.Exec(ctx, insertExpiredRow, args...); err != nil {
				t.Fatal(err)
			}
			release = holdKeyRow(t, lockDSN, lockKeyRow, args...)
		} else {
			release = holdKeyRow(t, lockDSN, insertKeyRow, args...)
		}
		// Far longer than the lock timeout: an unbounded wait ends here,
		// with context.DeadlineExceeded instead of ErrInUse.
		cctx, cancel := context.WithTimeout(ctx, 20*lockTimeout)
		err := run(cctx, optimistic)
		cancel()
		want, retryOptimistic := store.ErrInUse, optimistic
		if optimistic && tc.takeover && tc.code == code.Code_OK {
			// An optimistic record does not take an expired row over: it
			// fails on the primary key at once, without waiting for the
			// row's lock, and the atomic claim that follows takes it over.
			want, retryOptimistic = store.ErrConflict, false
		}
		if !errors.Is(err, want) {
			t.Errorf("%s: record behind the locked key row: %v, want %v", tc.name, err, want)
		}
		if w, c := rows(); w != 0 || c != 0 {
			t.Fatalf("%s: a record that gave up committed %d writes and %d completed keys, want none", tc.name, w, c)
		}

		release()
		if err := run(ctx, retryOptimistic); err != nil {
			t.Fatalf("%s: retry once the row is free: %v", tc.name, err)
		}
		wantWrites := 1
		if tc.code != code.Code_OK {
			wantWrites = 0 // a recorded error discards the writes
		}
		if w, c := rows(); w != wantWrites || c != 1 {
			t.Fatalf("%s: after the retry %d writes and %d completed keys, want %d and 1", tc.name, w, c, wantWrites)
		}
	}
}

// leaseWritesGiveUpBehindLockedKeyRow leases two keys of s and locks their
// rows in a session of its own on lockDSN: extending, saving a step,
// recording and releasing must each give up with store.ErrInUse (not
// ErrLeaseLost: the lease is still the caller's) and change nothing; once
// the session is gone the lease records.
func leaseWritesGiveUpBehindLockedKeyRow(t *testing.T, s *postgres.Store, pool *pgxpool.Pool, lockDSN string, lockTimeout time.Duration) {
	t.Helper()
	held := store.Scope{Tenant: "t", Method: "/svc/M", Key: "leased"}
	released := store.Scope{Tenant: "t", Method: "/svc/M", Key: "leased-released"}
	var leases []store.Lease
	for _, k := range []store.Scope{held, released} {
		l, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
		if err != nil || l.Lease == nil {
			t.Fatalf("lease of %s: %+v, %v", k.Key, l, err)
		}
		leases = append(leases, l.Lease)
	}
	before := func() string {
		t.Helper()
		var rows string
		if err := pool.QueryRow(ctx, `SELECT string_agg(concat_ws(',', key, status, locked_until, step_names, fencing_token), ';' ORDER BY key)
			FROM idempotency_keys WHERE key IN ($1, $2)`, held.Key, released.Key).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		return rows
	}()
	release := holdKeyRow(t, lockDSN, `SELECT FROM idempotency_keys WHERE tenant = $1 AND method = $2 AND key IN ($3, $4) FOR UPDATE`,
		held.Tenant, held.Method, held.Key, released.Key)

	for _, w := range []struct {
		name  string
		write func(ctx context.Context) error
	}{
		{"extend", func(ctx context.Context) error { return leases[0].Extend(ctx, time.Hour) }},
		{"save", func(ctx context.Context) error {
			return leases[0].SaveStep(ctx, store.Step{Name: "charge", Result: []byte("ch_1")})
		}},
		{"record", func(ctx context.Context) error {
			return leases[0].Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")})
		}},
		{"release", func(ctx context.Context) error { return leases[1].Release(ctx) }},
	} {
		cctx, cancel := context.WithTimeout(ctx, 20*lockTimeout)
		err := w.write(cctx)
		cancel()
		if !errors.Is(err, store.ErrInUse) || errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("lease %s behind the locked key row: %v, want ErrInUse", w.name, err)
		}
	}
	if steps := leases[0].Steps(); len(steps) != 0 {
		t.Fatalf("a save that gave up set the lease's steps: %+v", steps)
	}

	release()
	var after string
	if err := pool.QueryRow(ctx, `SELECT string_agg(concat_ws(',', key, status, locked_until, step_names, fencing_token), ';' ORDER BY key)
		FROM idempotency_keys WHERE key IN ($1, $2)`, held.Key, released.Key).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("the writes that gave up changed the rows:\n%s\nwant\n%s", after, before)
	}
	// The record that gave up left the lease the caller's.
	if err := leases[0].Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
		t.Fatalf("record once the row is free: %v", err)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM idempotency_keys WHERE key = $1`, held.Key).Scan(&status); err != nil || status != "recorded" {
		t.Fatalf("the leased key is %q (%v), want completed", status, err)
	}
}
