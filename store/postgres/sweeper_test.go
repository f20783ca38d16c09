package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// waitLimit bounds the waits of these tests for something that happens in
// the background, so that a bug fails the test instead of hanging it. It is
// far above what any of them needs.
const waitLimit = 2 * time.Minute

// openPool opens a pool of its own on the database connString names.
func openPool(t *testing.T, connString string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// count runs a query of one integer.
var count = pgtest.Count

// insertKeys inserts n recorded idempotency keys named prefix1 … prefixN
// with response "r", spread over 7 tenants and 3 methods (see liveKey).
// Their expiry is now + expiresIn, minus one millisecond per row, so that
// no two share an instant. One statement inserts them all.
func insertKeys(t *testing.T, pool *pgxpool.Pool, prefix string, n int, expiresIn string) {
	t.Helper()
	exec(t, pool, `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, response, expires_at)
SELECT `+pgtest.KeyIDSQL("t", "m", "k")+`, t, m, k, '\x01', 'recorded', 0, 'r',
       now() + $2::interval - g * interval '1 ms'
FROM generate_series(1, $3::int) g,
    LATERAL (SELECT 'tenant-' || (g % 7), '/svc/M' || (g % 3), $1::text || g) v(t, m, k)`, prefix, expiresIn, n)
}

// liveKey is the key insertKeys made as row i of prefix.
func liveKey(prefix string, i int) store.Scope {
	return store.Scope{
		Tenant: fmt.Sprintf("tenant-%d", i%7),
		Method: fmt.Sprintf("/svc/M%d", i%3),
		Key:    fmt.Sprintf("%s%d", prefix, i),
	}
}

// insertMessages is insertKeys for processed_messages, over 5 consumers.
func insertMessages(t *testing.T, pool *pgxpool.Pool, prefix string, n int, expiresIn string) {
	t.Helper()
	exec(t, pool, `INSERT INTO processed_messages (consumer, message_id, expires_at)
SELECT 'consumer-' || (g % 5), $1::text || g, now() + $2::interval - g * interval '1 ms'
FROM generate_series(1, $3::int) g`, prefix, expiresIn, n)
}

// recordBatches makes every DELETE on the two swept tables append the
// number of rows it removed to the table sweep_batches, so that a test can
// see the batches the sweeper committed.
func recordBatches(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	exec(t, pool, `CREATE TABLE sweep_batches (id bigserial PRIMARY KEY, tbl text NOT NULL, deleted bigint NOT NULL)`)
	exec(t, pool, `CREATE FUNCTION record_sweep_batch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sweep_batches (tbl, deleted) SELECT TG_TABLE_NAME, count(*) FROM old_rows;
    RETURN NULL;
END $$`)
	for _, tbl := range []string{"idempotency_keys", "processed_messages"} {
		exec(t, pool, `CREATE TRIGGER record_sweep_batch AFTER DELETE ON `+tbl+`
REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION record_sweep_batch()`)
	}
}

// batches returns the sizes of the DELETEs on tbl, in commit order.
func batches(t *testing.T, pool *pgxpool.Pool, tbl string) []int64 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT deleted FROM sweep_batches WHERE tbl = $1 ORDER BY id`, tbl)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var sizes []int64
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return sizes
}

// liveDigest summarizes every live row of both tables, so that a test can
// tell they were left exactly as they were.
func liveDigest(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var keys, messages string
	err := pool.QueryRow(ctx, `SELECT
    (SELECT count(*) || ':' || md5(string_agg(concat_ws('|', tenant, method, key, status, response, expires_at, updated_at), ',' ORDER BY tenant, method, key))
     FROM idempotency_keys WHERE key LIKE 'live-%'),
    (SELECT count(*) || ':' || md5(string_agg(concat_ws('|', consumer, message_id, expires_at), ',' ORDER BY consumer, message_id))
     FROM processed_messages WHERE expires_at > now())`).Scan(&keys, &messages)
	if err != nil {
		t.Fatal(err)
	}
	return keys + " " + messages
}

const (
	expiredKeys     = 100_250 // 100 full batches and one of 250
	expiredMessages = 20_000  // 20 full batches and one that finds nothing
	liveKeys        = 2_000
	liveMessages    = 500
	batchSize       = 1000
)

// fill inserts the expired and live rows the sweep tests work on.
func fill(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	insertKeys(t, pool, "expired-", expiredKeys, "-1 hour")
	insertKeys(t, pool, "live-", liveKeys, "1 hour")
	insertMessages(t, pool, "expired-", expiredMessages, "-1 hour")
	insertMessages(t, pool, "live-", liveMessages, "1 hour")
	exec(t, pool, `ANALYZE idempotency_keys, processed_messages`)
}

// checkSwept checks that no expired row is left and that the live rows are
// as before.
func checkSwept(t *testing.T, pool *pgxpool.Pool, digest string) {
	t.Helper()
	if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE expires_at <= now()`); n != 0 {
		t.Errorf("%d expired idempotency keys left", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages WHERE expires_at <= now()`); n != 0 {
		t.Errorf("%d expired processed messages left", n)
	}
	if got := liveDigest(t, pool); got != digest {
		t.Errorf("live rows changed:\n got %s\nwant %s", got, digest)
	}
}

func TestSweepDeletesExpiredRowsInBatchesWhileClaimsRun(t *testing.T) {
	connString := pgtest.NewDatabase(t)
	admin := openPool(t, connString)
	fill(t, admin)
	recordBatches(t, admin)
	digest := liveDigest(t, admin)

	// Claimers run on a pool of their own and alternate between a fresh
	// key, which they claim and complete, and a live completed key, whose
	// entry they read. A claim counts as during the sweep if the sweep had
	// begun when it started and had not ended when it finished.
	const (
		before int32 = iota
		during
		after
	)
	var (
		phase          atomic.Int32
		fresh, replays atomic.Int64 // completed during the sweep
		freshAll       atomic.Int64 // completed at any time
		errMu          sync.Mutex
		errs           []error
		warm, done     sync.WaitGroup
	)
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		errs = append(errs, err)
	}
	s := postgres.New(openPool(t, connString))
	const claimers = 3
	warm.Add(claimers)
	done.Add(claimers)
	for w := range claimers {
		go func() {
			defer done.Done()
			for i := 0; phase.Load() != after; i++ {
				start := phase.Load()
				var err error
				if i%2 == 0 {
					err = claimFresh(s, store.Scope{Tenant: "tenant-1", Method: "/svc/M1", Key: fmt.Sprintf("fresh-%d-%d", w, i)})
				} else {
					err = claimLive(s, liveKey("live-", 1+(w*7919+i)%liveKeys))
				}
				if i == 1 {
					warm.Done() // both kinds have been tried once
				}
				if err != nil {
					fail(err)
					continue
				}
				if i%2 == 0 {
					freshAll.Add(1)
				}
				if start == during && phase.Load() == during {
					if i%2 == 0 {
						fresh.Add(1)
					} else {
						replays.Add(1)
					}
				}
			}
		}()
	}
	warm.Wait()

	sw := postgres.NewSweeper(openPool(t, connString),
		postgres.WithBatchSize(batchSize),
		postgres.WithPause(10*time.Millisecond))
	phase.Store(during)
	deleted, err := sw.Sweep(ctx)
	phase.Store(after)
	done.Wait()

	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if want := int64(expiredKeys + expiredMessages); deleted != want {
		t.Errorf("Sweep deleted %d rows, want %d", deleted, want)
	}
	for _, err := range errs {
		t.Errorf("claim: %v", err)
	}
	if fresh.Load() == 0 || replays.Load() == 0 {
		t.Errorf("during the sweep, %d fresh keys were claimed and completed and %d live keys replayed; want both > 0",
			fresh.Load(), replays.Load())
	}
	checkSwept(t, admin, digest)
	if n := count(t, admin, `SELECT count(*) FROM idempotency_keys WHERE key LIKE 'fresh-%' AND status = 'recorded'`); n != freshAll.Load() {
		t.Errorf("%d fresh keys stored, want the %d completed", n, freshAll.Load())
	}

	// Each DELETE removed one batch: full ones until the table ran out.
	keyBatches := batches(t, admin, "idempotency_keys")
	wantKeyBatches := make([]int64, expiredKeys/batchSize, expiredKeys/batchSize+1)
	for i := range wantKeyBatches {
		wantKeyBatches[i] = batchSize
	}
	wantKeyBatches = append(wantKeyBatches, expiredKeys%batchSize)
	if fmt.Sprint(keyBatches) != fmt.Sprint(wantKeyBatches) {
		t.Errorf("idempotency_keys batches: %v\nwant %v", keyBatches, wantKeyBatches)
	}
	msgBatches := batches(t, admin, "processed_messages")
	wantMsgBatches := make([]int64, expiredMessages/batchSize+1)
	for i := range expiredMessages / batchSize {
		wantMsgBatches[i] = batchSize
	}
	if fmt.Sprint(msgBatches) != fmt.Sprint(wantMsgBatches) {
		t.Errorf("processed_messages batches: %v\nwant %v", msgBatches, wantMsgBatches)
	}
	t.Logf("deleted %d expired keys in %d batches and %d expired messages in %d batches; meanwhile %d fresh keys claimed and completed, %d live keys replayed",
		expiredKeys, len(keyBatches), expiredMessages, len(msgBatches), fresh.Load(), replays.Load())

	// A second pass finds nothing.
	if deleted, err := sw.Sweep(ctx); deleted != 0 || err != nil {
		t.Errorf("second Sweep: %d, %v; want 0, nil", deleted, err)
	}
}

// claimFresh claims a key nobody has and completes it.
func claimFresh(s *postgres.Store, k store.Scope) error {
	c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil {
		return fmt.Errorf("fresh key %s: %w", k.Key, err)
	}
	if c.Txn == nil {
		return fmt.Errorf("fresh key %s: found an entry %+v", k.Key, c.Entry)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte(k.Key)}); err != nil {
		return fmt.Errorf("fresh key %s: complete: %w", k.Key, err)
	}
	return nil
}

// claimLive claims a live completed key and expects its entry.
func claimLive(s *postgres.Store, k store.Scope) error {
	c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte{1}})
	if err != nil {
		return fmt.Errorf("live key %s: %w", k.Key, err)
	}
	if c.Txn != nil {
		_ = c.Txn.Release(ctx)
		return fmt.Errorf("live key %s: claimed it; want its entry", k.Key)
	}
	if c.Entry.State != store.Recorded || c.Entry.Outcome.Code != code.Code_OK || !bytes.Equal(c.Entry.Outcome.Body, []byte("r")) {
		return fmt.Errorf("live key %s: entry %+v", k.Key, c.Entry)
	}
	return nil
}

func TestConcurrentSweepersDeleteEachRowOnce(t *testing.T) {
	connString := pgtest.NewDatabase(t)
	admin := openPool(t, connString)
	fill(t, admin)
	recordBatches(t, admin)
	digest := liveDigest(t, admin)

	const sweepers = 2
	var (
		deleted [sweepers]int64
		errs    [sweepers]error
		ready   sync.WaitGroup
		wg      sync.WaitGroup
		start   = make(chan struct{})
	)
	ready.Add(sweepers)
	wg.Add(sweepers)
	for i := range sweepers {
		sw := postgres.NewSweeper(openPool(t, connString),
			postgres.WithBatchSize(batchSize),
			postgres.WithPause(0))
		go func() {
			defer wg.Done()
			ready.Done()
			<-start
			deleted[i], errs[i] = sw.Sweep(ctx)
		}()
	}
	ready.Wait()
	close(start)
	wg.Wait()

	for i, err := range errs {
		if err != nil {
			t.Errorf("sweeper %d: %v", i, err)
		}
	}
	if total, want := deleted[0]+deleted[1], int64(expiredKeys+expiredMessages); total != want {
		t.Errorf("sweepers deleted %d + %d rows, want %d in all", deleted[0], deleted[1], want)
	}
	checkSwept(t, admin, digest)
	var n int
	var sum int64
	for _, tbl := range []string{"idempotency_keys", "processed_messages"} {
		for _, b := range batches(t, admin, tbl) {
			if b > batchSize {
				t.Errorf("a batch of %s deleted %d rows, more than %d", tbl, b, batchSize)
			}
			sum += b
			n++
		}
	}
	if sum != expiredKeys+expiredMessages {
		t.Errorf("batches deleted %d rows, want %d", sum, expiredKeys+expiredMessages)
	}
	t.Logf("sweepers deleted %d and %d rows in %d statements", deleted[0], deleted[1], n)
}

func TestSweepContinuesPastAFailingTable(t *testing.T) {
	pool := pgtest.NewPool(t)
	insertKeys(t, pool, "expired-", 2500, "-1 hour")
	exec(t, pool, `ALTER TABLE processed_messages RENAME TO processed_messages_away`)

	deleted, err := postgres.NewSweeper(pool).Sweep(ctx)
	if err == nil || !strings.Contains(err.Error(), "processed_messages") {
		t.Errorf("Sweep without processed_messages: %v; want an error that names it", err)
	}
	if deleted != 2500 {
		t.Errorf("Sweep deleted %d expired keys, want 2500", deleted)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	pool := pgtest.NewPool(t)
	insertKeys(t, pool, "expired-", 3000, "-1 hour")

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	var log syncBuffer
	sw := postgres.NewSweeper(pool, postgres.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	go func() { done <- sw.Run(runCtx) }()

	// The first pass runs at once; the next would come a minute later.
	waitFor(t, "the first pass", func() bool {
		return count(t, pool, `SELECT count(*) FROM idempotency_keys`) == 0
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after its context was cancelled")
	}
	// A healthy sweeper says nothing at level INFO.
	if got := log.String(); got != "" {
		t.Errorf("a pass that deleted rows logged at level INFO or above:\n%s", got)
	}
}

func TestRunWithEndedContextDoesNothing(t *testing.T) {
	pool := pgtest.NewPool(t)
	insertKeys(t, pool, "expired-", 10, "-1 hour")
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := postgres.NewSweeper(pool).Run(ended); !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM idempotency_keys`); n != 10 {
		t.Errorf("%d keys left, want all 10", n)
	}
}

func TestRunKeepsGoingAfterAFailedPass(t *testing.T) {
	pool := pgtest.NewPool(t)
	insertKeys(t, pool, "expired-", 1500, "-1 hour")
	insertMessages(t, pool, "expired-", 1500, "-1 hour")
	// Every pass fails on processed_messages until it is back.
	exec(t, pool, `ALTER TABLE processed_messages RENAME TO processed_messages_away`)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	var log syncBuffer
	sw := postgres.NewSweeper(openPool(t, pool.Config().ConnString()), postgres.WithInterval(50*time.Millisecond),
		postgres.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	go func() { done <- sw.Run(runCtx) }()

	waitFor(t, "a pass to sweep idempotency_keys", func() bool {
		return count(t, pool, `SELECT count(*) FROM idempotency_keys`) == 0
	})
	// Later passes still run: they sweep keys that expire from now on...
	insertKeys(t, pool, "expired-", 1500, "-1 hour")
	waitFor(t, "a later pass to sweep idempotency_keys", func() bool {
		return count(t, pool, `SELECT count(*) FROM idempotency_keys`) == 0
	})
	// ...and processed_messages once it can.
	exec(t, pool, `ALTER TABLE processed_messages_away RENAME TO processed_messages`)
	waitFor(t, "a pass to sweep processed_messages", func() bool {
		return count(t, pool, `SELECT count(*) FROM processed_messages`) == 0
	})
	select {
	case err := <-done:
		t.Fatalf("Run returned %v before its context ended", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	// The failed passes went to the sweeper's logger, naming the table.
	if got := log.String(); !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "processed_messages") {
		t.Errorf("the failed passes were not logged at level ERROR with the table:\n%s", got)
	}
}

// TestRunGivesUpABatchWithoutAnswer cuts the network between the sweeper
// and the server, as a partition that isolates the primary does: a pass
// that gets no answer gives up within the batch timeout and is logged, the
// passes go on, and once the network is back they sweep again.
func TestRunGivesUpABatchWithoutAnswer(t *testing.T) {
	pool := pgtest.NewPool(t)
	link, through := pgtest.LinkTo(t, pool.Config().ConnString())
	insertKeys(t, pool, "expired-", 10, "-1 hour")

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	var log syncBuffer
	sw := postgres.NewSweeper(openPool(t, through), postgres.WithInterval(50*time.Millisecond),
		postgres.WithSweepBatchTimeout(300*time.Millisecond), postgres.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	go func() { done <- sw.Run(runCtx) }()
	waitFor(t, "the first pass", func() bool {
		return count(t, pool, `SELECT count(*) FROM idempotency_keys`) == 0
	})

	link.Cut()
	const failed = "sweeping expired rows failed"
	waitFor(t, "two passes without an answer to be logged", func() bool {
		return strings.Count(log.String(), failed) >= 2
	})
	link.Heal()
	insertKeys(t, pool, "expired-", 10, "-1 hour")
	waitFor(t, "a pass to sweep once the network is back", func() bool {
		return count(t, pool, `SELECT count(*) FROM idempotency_keys`) == 0
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use, for a logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor polls cond until it holds, and fails the test if that takes
// longer than waitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitForLockWait waits until a session of pool's database waits for a
// lock.
var waitForLockWait = pgtest.WaitForLockWait

// TestVacuumDoesNotTruncateKeys checks that vacuuming idempotency_keys after
// the sweeper emptied it keeps the file (migration 0006): truncating it
// would take an ACCESS EXCLUSIVE lock, and every claim arriving meanwhile
// would give up at once (its LOCK TABLE ... NOWAIT) with ABORTED, as if its
// key were in use.
func TestVacuumDoesNotTruncateKeys(t *testing.T) {
	pool := pgtest.NewPool(t)
	insertKeys(t, pool, "gone", 5000, "-1 hour")
	n, err := postgres.NewSweeper(pool, postgres.WithPause(0)).Sweep(ctx)
	if err != nil || n != 5000 {
		t.Fatalf("Sweep = %d, %v; want 5000 rows", n, err)
	}
	exec(t, pool, `VACUUM idempotency_keys`)
	if size := count(t, pool, `SELECT pg_relation_size('idempotency_keys')`); size == 0 {
		t.Fatal("VACUUM truncated idempotency_keys: vacuum_truncate is on, so vacuum takes an ACCESS EXCLUSIVE lock that makes claims fail")
	}
}

// TestSweepDeletesAuditPastItsRetention: the sweeper deletes the audit
// trail's entries whose retention has passed, and keeps the others.
func TestSweepDeletesAuditPastItsRetention(t *testing.T) {
	pool := pgtest.NewPool(t)
	k := store.Scope{Tenant: "t", Method: "/m", Key: "k"}
	entry := func(reason string) store.AuditEntry {
		return store.AuditEntry{Scope: k, Action: store.ActionFinish, Operator: "op", Reason: reason, Before: store.Abandoned, After: store.Recorded}
	}
	// Written two hours ago with a retention of one: past it.
	past := postgres.New(pool, postgres.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }), postgres.WithAuditRetention(time.Hour))
	if err := past.AddAudit(ctx, entry("old")); err != nil {
		t.Fatal(err)
	}
	if err := postgres.New(pool).AddAudit(ctx, entry("new")); err != nil {
		t.Fatal(err)
	}
	deleted, err := postgres.NewSweeper(pool).Sweep(ctx)
	if err != nil || deleted != 1 {
		t.Fatalf("Sweep: %d rows, %v; want the old audit entry", deleted, err)
	}
	list, _, err := postgres.New(pool).AuditLog(ctx, store.AuditFilter{Tenant: "t"})
	if err != nil || len(list) != 1 || list[0].Reason != "new" {
		t.Errorf("the audit trail after the sweep: %+v, %v; want the new entry only", list, err)
	}
}
