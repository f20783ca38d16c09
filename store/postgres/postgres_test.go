package postgres_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/migrations"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

var ctx = context.Background()

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	pool := pgtest.NewPool(t) // already migrated once
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- postgres.Migrate(ctx, pool)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var versions int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_schema_migrations`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	if versions != len(files) {
		t.Fatalf("%d versions recorded, want %d", versions, len(files))
	}
}

// TestMigrateConcurrentOnEmptyDatabase starts replicas together on a
// database that has none of idem's tables, round after round: every
// Migrate must succeed, whichever creates the version table. Concurrent
// CREATE TABLE IF NOT EXISTS statements may collide in the catalog, with
// either a unique violation or "type already exists".
func TestMigrateConcurrentOnEmptyDatabase(t *testing.T) {
	pool := pgtest.NewPool(t)
	for round := range 20 {
		if _, err := pool.Exec(ctx, `DROP TABLE idempotency_keys, processed_messages, idem_schema_migrations`); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if err := postgres.Migrate(ctx, pool); err != nil {
					t.Errorf("round %d: %v", round, err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		if err := postgres.New(pool).Check(ctx); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

var key = store.Scope{Tenant: "t", Method: "/svc/M", Key: "k"}

func TestClaimRecordReplay(t *testing.T) {
	s := postgres.New(pgtest.NewPool(t))
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("first claim: %+v, %v", c, err)
	}
	tx, ok := postgres.TxFromContext(c.Txn.Context(ctx))
	if !ok {
		t.Fatal("no transaction in the claim's context")
	}
	var timeout string
	if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&timeout); err != nil {
		t.Fatal(err)
	}
	if timeout != "0" {
		t.Fatalf("handler runs with lock_timeout %s; the claim's bound leaked into the handler", timeout)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("resp")}); err != nil {
		t.Fatal(err)
	}
	if err := c.Txn.Release(ctx); err != nil {
		t.Fatalf("Release after Record: %v", err)
	}

	again, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("other")})
	if err != nil || again.Entry == nil {
		t.Fatalf("second claim: %+v, %v", again, err)
	}
	e := again.Entry
	if e.State != store.Recorded || string(e.Fingerprint) != "fp" || e.Outcome.Code != code.Code_OK || string(e.Outcome.Body) != "resp" {
		t.Fatalf("entry %+v", e)
	}
	if time.Until(e.ExpiresAt) < 23*time.Hour {
		t.Fatalf("expires at %v, want about 24h from now", e.ExpiresAt)
	}
}

func TestReleaseLeavesNothing(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Txn.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows after Release, want 0", n)
	}
	c, err = s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim after Release: %+v, %v", c, err)
	}
	_ = c.Txn.Release(ctx)
}

func TestConcurrentClaimsHaveOneOwner(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool, postgres.WithLockTimeout(5*time.Second))
	var (
		owners, entries atomic.Int32
		wg, called      sync.WaitGroup
	)
	called.Add(32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			called.Done()
			c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
			switch {
			case err != nil:
				t.Error(err)
			case c.Txn != nil:
				owners.Add(1)
				called.Wait() // the others called Claim while the key is held
				if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK}); err != nil {
					t.Error(err)
				}
			default:
				entries.Add(1)
			}
		}()
	}
	wg.Wait()
	if owners.Load() != 1 || entries.Load() != 31 {
		t.Fatalf("%d owners and %d entries, want 1 and 31", owners.Load(), entries.Load())
	}
}

func TestClaimWaitIsBounded(t *testing.T) {
	pool := pgtest.NewPool(t)
	// The lock timeout also bounds the wait for a pool connection: open
	// the two the claims need first, so that on a busy machine the second
	// claim waits for the key, not for a connection to be opened.
	conns := make([]*pgxpool.Conn, 2)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
	s := postgres.New(pool, postgres.WithLockTimeout(50*time.Millisecond))
	owner, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = owner.Txn.Release(ctx) }()
	_, err = s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if !errors.Is(err, store.ErrInUse) {
		t.Fatalf("claim of a held key: %v, want ErrInUse", err)
	}
	// The owner's rollback frees the key for the next claim.
	if err := owner.Txn.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim after the owner released: %+v, %v", c, err)
	}
	_ = c.Txn.Release(ctx)
}

func TestErrorOutcomeDiscardsWrites(t *testing.T) {
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE w (v int)`); err != nil {
		t.Fatal(err)
	}
	s := postgres.New(pool)
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
	if _, err := tx.Exec(ctx, `INSERT INTO w VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	// A failed statement aborts the transaction; recording an error rolls
	// back to the claim's savepoint, which recovers it.
	if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: []byte("st")}); err != nil {
		t.Fatal(err)
	}
	var writes, keys int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM idempotency_keys WHERE response_code = 3)`).Scan(&writes, &keys); err != nil {
		t.Fatal(err)
	}
	if writes != 0 || keys != 1 {
		t.Fatalf("%d writes and %d recorded keys, want 0 and 1", writes, keys)
	}
}

func TestSuccessOnAbortedTransactionCommitsNothing(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
	_, _ = tx.Exec(ctx, `SELECT 1/0`) // a handler that swallows this error
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err == nil {
		t.Fatal("Record succeeded on an aborted transaction")
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d keys recorded, want 0", n)
	}
}

func TestHandlerTxLargeObjectsJoinTheClaim(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
	los := tx.LargeObjects()
	oid, err := los.Create(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Released: the large object goes with the claim.
	if err := c.Txn.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject_metadata WHERE oid = $1`, oid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("a large object created in a released claim survived")
	}
}

// skipWrites makes every INSERT and UPDATE of idempotency_keys a silent
// no-op, as a BEFORE trigger that returns NULL (or a row-level security
// policy that hides the rows) does. It returns a function that drops the
// trigger.
func skipWrites(t *testing.T, pool *pgxpool.Pool) (drop func()) {
	t.Helper()
	_, err := pool.Exec(ctx, `
CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER skip_write BEFORE INSERT OR UPDATE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION skip_row()`)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `DROP TRIGGER skip_write ON idempotency_keys`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecordThatTakesNoRowCommitsNothing covers a record that updates no
// row: the handler's writes and the claim must not commit without it, or
// the key would stay in progress, unanswerable, for its whole TTL.
func TestRecordThatTakesNoRowCommitsNothing(t *testing.T) {
	for _, tc := range []struct {
		mode pgx.QueryExecMode
		code code.Code
	}{
		{pgx.QueryExecModeCacheStatement, code.Code_OK},
		{pgx.QueryExecModeCacheStatement, code.Code_INVALID_ARGUMENT},
		{pgx.QueryExecModeExec, code.Code_OK},
		{pgx.QueryExecModeSimpleProtocol, code.Code_OK},
	} {
		oc := tc.code
		t.Run(tc.mode.String()+"/"+oc.String(), func(t *testing.T) {
			pool := newPool(t, pgtest.NewDatabase(t), tc.mode)
			if _, err := pool.Exec(ctx, `CREATE TABLE w (v int)`); err != nil {
				t.Fatal(err)
			}
			s := postgres.New(pool)
			run := func() error {
				t.Helper()
				c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
				if err != nil || c.Txn == nil {
					t.Fatalf("claim: %+v, %v; want to own the key", c, err)
				}
				defer func() { _ = c.Txn.Release(ctx) }()
				tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
				if _, err := tx.Exec(ctx, `INSERT INTO w VALUES (1)`); err != nil {
					t.Fatal(err)
				}
				return c.Txn.Record(ctx, store.Outcome{Code: oc, Body: []byte("r")})
			}
			rows := func() (writes, keys int) {
				t.Helper()
				if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM idempotency_keys)`).Scan(&writes, &keys); err != nil {
					t.Fatal(err)
				}
				return writes, keys
			}

			drop := skipWrites(t, pool)
			err := run()
			if err == nil {
				t.Fatal("Record succeeded although the record updated no row")
			}
			if errors.Is(err, store.ErrInUse) || errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("Record: %v; want an error the interceptor answers UNAVAILABLE", err)
			}
			if w, k := rows(); w != 0 || k != 0 {
				t.Fatalf("after a record that took no row: %d writes and %d keys committed, want none", w, k)
			}

			drop()
			if err := run(); err != nil {
				t.Fatalf("retry: %v", err)
			}
			wantWrites := 1
			if oc != code.Code_OK {
				wantWrites = 0 // a recorded error discards the writes
			}
			if w, k := rows(); w != wantWrites || k != 1 {
				t.Fatalf("after the retry: %d writes and %d keys, want %d and 1", w, k, wantWrites)
			}
			var status string
			if err := pool.QueryRow(ctx, `SELECT status FROM idempotency_keys`).Scan(&status); err != nil || status != "recorded" {
				t.Fatalf("key status %q, %v; want recorded", status, err)
			}
		})
	}
}

// execModes are pgx's ways of sending a query, each of which sends idem's
// statements in round trips and encodings of its own.
var execModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}

// newPool returns a pool on the database dsn that sends queries in mode.
func newPool(t *testing.T, dsn string, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
