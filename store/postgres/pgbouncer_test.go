package postgres_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/inbox"
	"github.com/idemkit/idem/store/storetest"
)

// The tests in this file run the store through PgBouncer 1.18 in
// transaction mode (pgtest.NewPgBouncer), with a pool of two server
// connections per database and pgx in the exec mode the connection
// strings of pgtest.PgBouncer ask for. Transaction mode hands each
// transaction, and each statement outside one, whichever server connection
// is free: whatever idem left on a session outside its transaction (a SET,
// an advisory lock, a prepared statement) would meet another client's
// transactions there.

// pgBouncerPoolSize is PgBouncer's server connections per database: fewer
// than the clients of every case that runs claims side by side.
const pgBouncerPoolSize = 2

// TestPgBouncerConformance runs the store conformance suite through
// PgBouncer, on pools of four connections.
func TestPgBouncerConformance(t *testing.T) {
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: pgBouncerPoolSize})
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		pool := bouncedPool(t, b.NewDatabase(t), 4)
		return postgres.New(pool, postgres.WithTTL(cfg.TTL), postgres.WithLockTimeout(cfg.LockTimeout), postgres.WithClock(cfg.Now))
	})
}

// bouncedPool opens a pool of maxConns connections on dsn, a connection
// string through PgBouncer.
func bouncedPool(t *testing.T, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeExec {
		t.Fatalf("%s asks for exec mode %v, want exec", dsn, cfg.ConnConfig.DefaultQueryExecMode)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestPgBouncerClaimBehindTableLockIsBounded holds a lock on
// idempotency_keys on a connection of its own, straight to PostgreSQL,
// while claims run through PgBouncer: every claim, atomic or leased, on a
// new pool as on one that has claimed, gives up with store.ErrInUse after
// the lock timeout, and the key is served once the lock is gone.
func TestPgBouncerClaimBehindTableLockIsBounded(t *testing.T) {
	const lockTimeout = 300 * time.Millisecond
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: pgBouncerPoolSize})
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			direct := pgtest.NewDatabase(t)
			dsn, err := b.ConnString(direct)
			if err != nil {
				t.Fatal(err)
			}
			pool := bouncedPool(t, dsn, 4)
			if err := pool.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			s := postgres.New(pool, postgres.WithLockTimeout(lockTimeout))
			if warm {
				claimAndRecord(t, s, store.Scope{Tenant: "t", Method: "/svc/M", Key: "warm"})
			}

			claimsGiveUpBehindTableLock(t, s, pool, direct, "SHARE ROW EXCLUSIVE", lockTimeout)
			newWTable(t, pool)
			optimisticRecordsGiveUpBehindTableLock(t, s, pool, direct, "SHARE ROW EXCLUSIVE", lockTimeout)
		})
	}
}

// TestPgBouncerRecordBehindLockedKeyRowIsBounded records outcomes, and
// writes leases, through PgBouncer while a session of its own, straight to
// PostgreSQL, holds the key's row locked outside idem's lock: each gives
// up with store.ErrInUse after the lock timeout, and the key is recorded
// once the session is gone.
func TestPgBouncerRecordBehindLockedKeyRowIsBounded(t *testing.T) {
	const lockTimeout = 300 * time.Millisecond
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: pgBouncerPoolSize})
	direct := pgtest.NewDatabase(t)
	dsn, err := b.ConnString(direct)
	if err != nil {
		t.Fatal(err)
	}
	pool := bouncedPool(t, dsn, 4)
	s := postgres.New(pool, postgres.WithLockTimeout(lockTimeout))
	recordsGiveUpBehindLockedKeyRow(t, s, pool, direct, lockTimeout, false)
	recordsGiveUpBehindLockedKeyRow(t, s, pool, direct, lockTimeout, true)
	leaseWritesGiveUpBehindLockedKeyRow(t, s, pool, direct, lockTimeout)
}

// TestPgBouncerLeavesNoSessionState runs every kind of claim through a
// PgBouncer with one server connection, which the claims' transactions
// therefore take turns on, and then looks at that connection from another
// client: no lock_timeout, no idem setting, no advisory lock and no
// prepared statement may be left on it, since the next transaction there
// may be anyone's.
func TestPgBouncerLeavesNoSessionState(t *testing.T) {
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: 1})
	dsn := b.NewDatabase(t)
	pool := bouncedPool(t, dsn, 4)
	var defaultTimeout string
	if err := pool.QueryRow(ctx, `SHOW lock_timeout`).Scan(&defaultTimeout); err != nil {
		t.Fatal(err)
	}
	s := postgres.New(pool, postgres.WithLockTimeout(250*time.Millisecond))

	// A claim that executes, a replay, a recorded error, a claim that
	// waits for a key's owner and gives up, a lease and its record.
	claimAndRecord(t, s, store.Scope{Tenant: "t", Method: "/svc/M", Key: "done"})
	if c, err := s.Claim(ctx, store.Scope{Tenant: "t", Method: "/svc/M", Key: "done"}, store.ClaimRequest{Fingerprint: []byte("fp")}); err != nil || c.Entry == nil {
		t.Fatalf("replay: %+v, %v", c, err)
	}
	c, err := s.Claim(ctx, store.Scope{Tenant: "t", Method: "/svc/M", Key: "err"}, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: []byte("st")}); err != nil {
		t.Fatal(err)
	}
	// An optimistic claim that records, and one of the same key whose
	// record finds it taken.
	for i, want := range []error{nil, store.ErrConflict} {
		c, err := s.Claim(ctx, store.Scope{Tenant: "t", Method: "/svc/M", Key: "optimistic"}, store.ClaimRequest{Fingerprint: []byte("fp"), Optimistic: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); !errors.Is(err, want) {
			t.Fatalf("optimistic record %d: %v, want %v", i+1, err, want)
		}
	}
	// The owner pins the only server connection, so the duplicate waits
	// in PgBouncer's queue, not on the key's lock; it runs once the owner
	// rolls back.
	owner, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
		if err != nil {
			t.Errorf("duplicate after the owner released: %v", err)
			return
		}
		_ = c.Txn.Release(ctx)
	})
	time.Sleep(100 * time.Millisecond)
	if err := owner.Txn.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	// Another client, on the same and only server connection.
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	var (
		timeout, idemTimeout string
		advisory, prepared   int
	)
	err = other.QueryRow(ctx, `SELECT current_setting('lock_timeout'),
		coalesce(current_setting('idem.lock_timeout', true), ''),
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
		(SELECT count(*) FROM pg_prepared_statements)`).Scan(&timeout, &idemTimeout, &advisory, &prepared)
	if err != nil {
		t.Fatal(err)
	}
	if timeout != defaultTimeout || idemTimeout != "" || advisory != 0 || prepared != 0 {
		t.Errorf("the server connection kept lock_timeout %q (want %q), idem.lock_timeout %q (want empty), "+
			"%d advisory locks and %d prepared statements (want none)", timeout, defaultTimeout, idemTimeout, advisory, prepared)
	}
}

// TestPgBouncerMigrateSweepInbox runs what runs beside the claims through
// PgBouncer: Migrate of an empty schema from replicas starting together,
// the sweeper, and the inbox of a message consumer.
func TestPgBouncerMigrateSweepInbox(t *testing.T) {
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: pgBouncerPoolSize})
	pool := bouncedPool(t, b.NewDatabase(t), 4)
	if _, err := pool.Exec(ctx, `DROP TABLE idempotency_keys, processed_messages, idem_schema_migrations`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := postgres.Migrate(ctx, pool); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	s := postgres.New(pool)
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}

	// Expired keys and messages, and a live one of each.
	claimAndRecord(t, s, key)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, expires_at)
		SELECT gen_random_uuid(), 't', '/svc/M', 'old-' || i, '\x01', 'recorded', 0, now() - interval '1 hour'
		FROM generate_series(1, 25) i`)
	in := inbox.New(pool, "shipping")
	var runs int
	for range 2 {
		if _, err := in.ProcessOnce(ctx, "order-1", func(pgx.Tx) error { runs++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 1 {
		t.Fatalf("a message delivered twice was processed %d times, want 1", runs)
	}
	exec(`INSERT INTO processed_messages (consumer, message_id, expires_at)
		SELECT 'shipping', 'old-' || i, now() - interval '1 hour' FROM generate_series(1, 5) i`)

	deleted, err := postgres.NewSweeper(pool, postgres.WithBatchSize(10), postgres.WithPause(0)).Sweep(ctx)
	if err != nil || deleted != 30 {
		t.Fatalf("Sweep: %d rows, %v; want 30", deleted, err)
	}
	var keys, messages int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM processed_messages)`).Scan(&keys, &messages); err != nil {
		t.Fatal(err)
	}
	if keys != 2 || messages != 1 {
		t.Fatalf("%d keys and %d messages left, want the live 2 and 1", keys, messages)
	}
}
