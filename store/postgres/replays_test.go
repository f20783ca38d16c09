package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// recordReplayed claims k and records an outcome, for replays to count.
func recordReplayed(t *testing.T, s *postgres.Store, k store.Scope) {
	t.Helper()
	c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim of %s: %+v, %v", k.Key, c, err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
}

// replaysOf reads how many replays k's row counts.
func replaysOf(t *testing.T, pool *pgxpool.Pool, k store.Scope) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(ctx, `SELECT replays FROM idempotency_keys WHERE tenant = $1 AND method = $2 AND key = $3`,
		k.Tenant, k.Method, k.Key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitForReplays waits until k's row counts n replays.
func waitForReplays(t *testing.T, pool *pgxpool.Pool, k store.Scope, n int64) {
	t.Helper()
	if !idemtest.Eventually(10*time.Second, func() bool { return replaysOf(t, pool, k) == n }) {
		t.Fatalf("%s counts %d replays, want %d", k.Key, replaysOf(t, pool, k), n)
	}
}

func replayKey(k string) store.Scope {
	return store.Scope{Tenant: "acme", Method: "/svc/M", Key: k}
}

// TestReplayCountsFlushOnTheirOwn: the store writes the counts it keeps
// without being asked, once a batch of keys' counts waits, and once its
// interval has passed since the first count that waits.
func TestReplayCountsFlushOnTheirOwn(t *testing.T) {
	t.Run("batch", func(t *testing.T) {
		pool := pgtest.NewPool(t)
		s := postgres.New(pool, postgres.WithReplayFlush(time.Hour, 2))
		a, b := replayKey("a"), replayKey("b")
		recordReplayed(t, s, a)
		recordReplayed(t, s, b)
		s.CountReplay(a)
		s.CountReplay(a)
		if n := postgres.PendingReplays(s); n != 1 {
			t.Fatalf("%d keys' counts wait, want 1: one key is not a batch of 2", n)
		}
		s.CountReplay(b)
		waitForReplays(t, pool, a, 2)
		waitForReplays(t, pool, b, 1)
	})
	t.Run("interval", func(t *testing.T) {
		pool := pgtest.NewPool(t)
		s := postgres.New(pool, postgres.WithReplayFlush(10*time.Millisecond, 1000))
		a := replayKey("a")
		recordReplayed(t, s, a)
		s.CountReplay(a)
		waitForReplays(t, pool, a, 1)
		s.CountReplay(a) // the timer is armed again
		waitForReplays(t, pool, a, 2)
	})
}

// TestReplayFlushSkipsLockedRows: a key's row that another session holds
// locked holds back its own count, which waits for the next flush, and
// neither the flush nor the other keys' counts. In every QueryExecMode.
func TestReplayFlushSkipsLockedRows(t *testing.T) {
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			replayFlushSkipsLockedRows(t, mode)
		})
	}
}

func replayFlushSkipsLockedRows(t *testing.T, mode pgx.QueryExecMode) {
	dsn := pgtest.NewDatabase(t)
	pool := newPool(t, dsn, mode)
	s := postgres.New(pool, postgres.WithReplayFlush(time.Hour, 1000), postgres.WithLockTimeout(time.Minute))
	locked, free := replayKey("locked"), replayKey("free")
	recordReplayed(t, s, locked)
	recordReplayed(t, s, free)
	release := holdKeyRow(t, dsn, lockKeyRow, locked.Tenant, locked.Method, locked.Key)
	s.CountReplay(locked)
	s.CountReplay(free)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second) // far above a flush that skips
	defer cancel()
	if err := s.FlushReplays(fctx); err != nil {
		t.Fatalf("flush beside a locked row: %v", err)
	}
	if n := replaysOf(t, pool, free); n != 1 {
		t.Errorf("the free key counts %d replays, want 1", n)
	}
	if n := replaysOf(t, pool, locked); n != 0 {
		t.Errorf("the locked key counts %d replays, want 0 while its row is locked", n)
	}
	if n := postgres.PendingReplays(s); n != 1 {
		t.Errorf("%d keys' counts wait, want the locked one's", n)
	}
	release()
	if err := s.FlushReplays(ctx); err != nil {
		t.Fatal(err)
	}
	if n := replaysOf(t, pool, locked); n != 1 {
		t.Errorf("the locked key counts %d replays once released, want 1", n)
	}
	if n := replaysOf(t, pool, free); n != 1 {
		t.Errorf("the free key counts %d replays after a second flush, want still 1", n)
	}
}

// TestReplaysDoNotWaitForAFlush: while a flush waits in the database (a
// trigger of the test's makes its UPDATE wait for an advisory lock the
// test holds), replays of the key are answered and counted, no second
// flush starts, and the counts of more keys than the store keeps are
// dropped, never the waiting ones; once the flush ends every count kept
// is written.
func TestReplaysDoNotWaitForAFlush(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool := newPool(t, dsn, pgx.QueryExecModeCacheStatement)
	const batch = 1 // so that every count starts a flush unless one runs; 100 keys kept
	s := postgres.New(pool, postgres.WithReplayFlush(time.Hour, batch), postgres.WithLockTimeout(time.Minute))
	k := replayKey("k")
	recordReplayed(t, s, k)
	if _, err := pool.Exec(ctx, `CREATE FUNCTION wait_for_test() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END $$;
CREATE TRIGGER wait_for_test BEFORE UPDATE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION wait_for_test()`); err != nil {
		t.Fatal(err)
	}
	holder, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close(ctx) }()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	s.CountReplay(k) // starts the flush that waits
	waitForAdvisoryLockWaiter(t, pool)

	rctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound, far above what replays take
	defer cancel()
	const replays = 50
	var wg sync.WaitGroup
	errs := make(chan error, replays)
	for range replays {
		wg.Go(func() {
			c, err := s.Claim(rctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
			switch {
			case err != nil:
				errs <- err
			case c.Entry == nil || c.Entry.State != store.Recorded:
				errs <- fmt.Errorf("a replay's claim got %+v, want the recorded entry", c)
			default:
				s.CountReplay(k)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range 150 {
		s.CountReplay(replayKey(fmt.Sprint("other-", i)))
	}
	if n := postgres.PendingReplays(s); n != 10 {
		t.Errorf("%d keys' counts wait behind the flush, want 10 (10 batches of 1 key)", n)
	}
	var waiting int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil || waiting != 1 {
		t.Errorf("%d flushes wait (%v), want the 1 that started", waiting, err)
	}
	if n := replaysOf(t, pool, k); n != 0 {
		t.Errorf("the key counts %d replays while the flush waits, want 0", n)
	}

	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	if err := s.FlushReplays(ctx); err != nil {
		t.Fatal(err)
	}
	if n := replaysOf(t, pool, k); n != 1+replays {
		t.Errorf("the key counts %d replays, want %d", n, 1+replays)
	}
}

// TestMigration0010 takes an installation of the schema before migration
// 0010, with a recorded key as the version before wrote it: Check, a
// leased claim and a flush of counts say the migration is missing, while
// the key still replays; after Migrate the key counts no replays, counts them once
// flushed, and the down migration takes the columns away again.
func TestMigration0010(t *testing.T) {
	pool := pgtest.NewPool(t)
	exec := migrateDownTo(t, pool, 9)
	exec(`INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, response, expires_at)
VALUES (` + pgtest.KeyIDSQL("'acme'", "'/svc/M'", "'k'") + `, 'acme', '/svc/M', 'k', 'fp', 'recorded', 0, 'done', now() + interval '1 hour')`)
	s := postgres.New(pool)
	k := replayKey("k")
	if err := s.Check(ctx); !errors.Is(err, store.ErrNotReady) || !strings.Contains(err.Error(), "0010_replay_counts") {
		t.Fatalf("Check before 0010: %v; want ErrNotReady naming the migration", err)
	}
	if c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")}); err != nil || c.Entry == nil {
		t.Fatalf("a replay before 0010: %+v, %v; want the recorded entry", c, err)
	}
	// A leased claim resets the counts of a row it takes over afresh: it
	// needs the columns, as Check says.
	if _, err := s.ClaimLeased(ctx, replayKey("leased"), store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute}); !errors.Is(err, store.ErrNotReady) {
		t.Fatalf("a leased claim before 0010: %v; want ErrNotReady", err)
	}
	s.CountReplay(k)
	if err := s.FlushReplays(ctx); !errors.Is(err, store.ErrNotReady) {
		t.Fatalf("a flush before 0010: %v; want ErrNotReady", err)
	}

	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ki, err := s.Key(ctx, k)
	if err != nil || ki.Replays != 0 || !ki.LastReplay.IsZero() {
		t.Fatalf("the key after the migration: %+v, %v; want no replays", ki, err)
	}
	s.CountReplay(k)
	if err := s.FlushReplays(ctx); err != nil {
		t.Fatal(err)
	}
	if ki, err = s.Key(ctx, k); err != nil || ki.Replays != 2 || ki.LastReplay.IsZero() {
		t.Fatalf("the key after a flush: %d replays, the last at %v (%v); want 2: the one kept while the flush failed, and one more", ki.Replays, ki.LastReplay, err)
	}

	migrateDownTo(t, pool, 9)
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency_keys'::regclass AND NOT attisdropped
    AND attname IN ('replays', 'last_replayed_at')`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d of the columns are left after the down migration (%v), want none", left, err)
	}
}

// TestReplayCountsOnShards: each key's count is written to its tenant's
// shard, in a batch of that shard's keys, and a tenant the route gives no
// shard is dropped without failing the others.
func TestReplayCountsOnShards(t *testing.T) {
	s, a, b := twoShards(t, postgres.WithReplayFlush(time.Hour, 1000))
	ka := store.Scope{Tenant: alpha, Method: "/svc/M", Key: "k"}
	kb := store.Scope{Tenant: beta, Method: "/svc/M", Key: "k"}
	recordReplayed(t, s, ka)
	recordReplayed(t, s, kb)
	s.CountReplay(ka)
	s.CountReplay(kb)
	s.CountReplay(kb)
	s.CountReplay(store.Scope{Tenant: nowhere, Method: "/svc/M", Key: "k"})
	if err := s.FlushReplays(ctx); err != nil {
		t.Fatal(err)
	}
	if n := replaysOf(t, a, ka); n != 1 {
		t.Errorf("alpha's key counts %d replays on its shard, want 1", n)
	}
	if n := replaysOf(t, b, kb); n != 2 {
		t.Errorf("beta's key counts %d replays on its shard, want 2", n)
	}
	if n := postgres.PendingReplays(s); n != 0 {
		t.Errorf("%d keys' counts wait after the flush, want none", n)
	}
}

// TestReplayFlushThatFailsKeepsItsCounts: a flush the store starts on its
// own that fails (behind a table lock, past the lock timeout) keeps the
// counts and arms no timer, so that a store whose database is gone stops
// trying; the next replay's count starts a flush again, which writes them
// all. FlushReplays returns the error of a flush that fails.
func TestReplayFlushThatFailsKeepsItsCounts(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool := newPool(t, dsn, pgx.QueryExecModeCacheStatement)
	s := postgres.New(pool, postgres.WithReplayFlush(time.Hour, 1), postgres.WithLockTimeout(50*time.Millisecond))
	k := replayKey("k")
	recordReplayed(t, s, k)
	release := holdTableLock(t, dsn, "EXCLUSIVE")
	if err := s.FlushReplays(ctx); err != nil {
		t.Fatalf("a flush of nothing: %v", err)
	}
	s.CountReplay(k) // a batch of 1: a flush starts, and fails
	if !idemtest.Eventually(10*time.Second, func() bool { running, _ := postgres.ReplayFlushState(s); return !running }) {
		t.Fatal("the flush behind the table lock never ended")
	}
	if _, armed := postgres.ReplayFlushState(s); armed {
		t.Error("a timer is armed after a failed flush, want none until the next count")
	}
	if n := postgres.PendingReplays(s); n != 1 {
		t.Fatalf("%d keys' counts kept after a failed flush, want 1", n)
	}
	if err := s.FlushReplays(ctx); !errors.Is(err, store.ErrInUse) {
		t.Fatalf("FlushReplays behind a table lock: %v; want store.ErrInUse", err)
	}

	release()
	s.CountReplay(k)
	waitForReplays(t, pool, k, 2)
}
