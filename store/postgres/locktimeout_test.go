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
	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
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
	release = func() { _ = conn.Close(ctx) } // closing rolls back
	t.Cleanup(release)
	return release
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
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	} {
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
				claimAndComplete(t, s, store.Key{Tenant: "t", Method: "/svc/M", Key: "warm"})
			}

			claimsGiveUpBehindTableLock(t, s, pool, dsn, tc.lock, lockTimeout)
		})
	}
}

// claimsGiveUpBehindTableLock holds lock on idempotency_keys on a
// connection of its own to lockDSN, and checks that claims and leases of s,
// twice each, give up with store.ErrInUse rather than wait; then it lets
// the lock go and checks that key is claimed and completed once, counting
// its rows through pool.
func claimsGiveUpBehindTableLock(t *testing.T, s *postgres.Store, pool *pgxpool.Pool, lockDSN, lock string, lockTimeout time.Duration) {
	t.Helper()
	release := holdTableLock(t, lockDSN, lock)
	// Far longer than the lock timeout: an unbounded wait ends here, with
	// context.DeadlineExceeded instead of ErrInUse.
	cctx, cancel := context.WithTimeout(ctx, 20*lockTimeout)
	defer cancel()
	for i := range 2 {
		if _, err := s.Claim(cctx, key, store.Request{Fingerprint: []byte("fp")}); !errors.Is(err, store.ErrInUse) {
			t.Fatalf("claim %d behind the table lock: %v, want ErrInUse", i+1, err)
		}
		if _, err := s.Lease(cctx, key, store.Request{Fingerprint: []byte("fp")}, time.Minute); !errors.Is(err, store.ErrInUse) {
			t.Fatalf("lease %d behind the table lock: %v, want ErrInUse", i+1, err)
		}
	}

	release()
	claimAndComplete(t, s, key)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND status = 'completed'`, key.Key).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d completed rows for the key (%v), want 1", n, err)
	}
}

// claimAndComplete claims k in atomic mode, and k's leased twin (its key
// with "-lease" appended) in leased mode, and completes both.
func claimAndComplete(t *testing.T, s *postgres.Store, k store.Key) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := s.Claim(cctx, k, store.Request{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim of %s: %+v, %v", k.Key, c, err)
	}
	if err := c.Txn.Complete(cctx, store.Outcome{Code: codes.OK, Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	k.Key += "-lease"
	l, err := s.Lease(cctx, k, store.Request{Fingerprint: []byte("fp")}, time.Minute)
	if err != nil || l.Lease == nil {
		t.Fatalf("lease of %s: %+v, %v", k.Key, l, err)
	}
	if err := l.Lease.Complete(cctx, store.Outcome{Code: codes.OK, Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
}

// TestClaimRoundTrips counts the round trips on the wire of claims on one
// connection: bounding the lock wait of a connection's first claim must
// cost nothing once the connection has claimed. A warm claim is one round
// trip; three in QueryExecModeDescribeExec, where pgx describes every
// statement of every batch in a round trip of its own, so the transaction
// is always opened in one before.
func TestClaimRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		mode pgx.QueryExecMode
		warm int64
	}{
		{pgx.QueryExecModeCacheStatement, 1},
		{pgx.QueryExecModeCacheDescribe, 1},
		{pgx.QueryExecModeDescribeExec, 3},
		{pgx.QueryExecModeExec, 1},
		{pgx.QueryExecModeSimpleProtocol, 1},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			t.Parallel()
			cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			cfg.ConnConfig.DefaultQueryExecMode = tc.mode
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
			var trips atomic.Int64
			cfg.ConnConfig.AfterNetConnect = func(_ context.Context, _ *pgconn.Config, conn net.Conn) (net.Conn, error) {
				return &tripConn{Conn: conn, trips: &trips}, nil
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if err := pool.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			s := postgres.New(pool)
			var atomicTrips, leaseTrips []int64
			for i := range 3 {
				k := store.Key{Tenant: "t", Method: "/svc/M", Key: fmt.Sprint("k", i)}
				before := trips.Load()
				c, err := s.Claim(ctx, k, store.Request{Fingerprint: []byte("fp")})
				if err != nil || c.Txn == nil {
					t.Fatalf("claim: %+v, %v", c, err)
				}
				atomicTrips = append(atomicTrips, trips.Load()-before)
				if err := c.Txn.Release(ctx); err != nil {
					t.Fatal(err)
				}
				before = trips.Load()
				l, err := s.Lease(ctx, k, store.Request{Fingerprint: []byte("fp")}, time.Minute)
				if err != nil || l.Lease == nil {
					t.Fatalf("lease: %+v, %v", l, err)
				}
				leaseTrips = append(leaseTrips, trips.Load()-before)
				if err := l.Lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("round trips of three atomic claims %v, of three leased claims %v", atomicTrips, leaseTrips)
			for i := 1; i < 3; i++ {
				if atomicTrips[i] != tc.warm || leaseTrips[i] != tc.warm {
					t.Fatalf("warm claims took %v (atomic) and %v (leased) round trips, want %d each", atomicTrips[1:], leaseTrips[1:], tc.warm)
				}
			}
		})
	}
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
