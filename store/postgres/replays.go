package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres/internal/pgerr"
)

var _ store.ReplayCounter = (*Store)(nil)

// The defaults of [WithReplayFlush], and the bounds of the counts kept in
// memory.
const (
	defaultReplayInterval = time.Second
	defaultReplayBatch    = 10000
	// replayKeptBatches is how many batches of keys' counts a store keeps
	// in memory at most, while its flushes fail or fall behind; the counts
	// of further keys are dropped.
	replayKeptBatches = 10
	// replayFlushTimeout bounds a flush the store starts on its own.
	replayFlushTimeout = 30 * time.Second
)

// WithReplayFlush sets how the store writes the replays it counts
// ([Store.CountReplay]): every interval after the first count that waits,
// and at once when the counts of batch keys wait, each write one UPDATE of
// at most batch rows. Counts that fail to be written wait for the next
// flush; the counts of at most 10 × batch keys are kept in memory, and a
// replay of a further key is not counted. Default: every second, or
// 10 000 keys. Non-positive values select the defaults.
func WithReplayFlush(interval time.Duration, batch int) Option {
	return func(o *options) {
		if interval <= 0 {
			interval = defaultReplayInterval
		}
		if batch <= 0 {
			batch = defaultReplayBatch
		}
		o.replayInterval, o.replayBatch = interval, batch
	}
}

// replayFlush adds the counts of a batch of keys, $1 to $3 (the rows' ids,
// the counts and the last replays' times), to the rows of the keys that
// are still recorded. It locks the rows it adds to in the order of their
// ids, skipping those that another transaction holds (a claim taking an
// expired row over, a forget, a session of the application's own): a
// flush never waits for a row, so one row held for long holds back its
// own count only, not those of the batch, and two servers' flushes never
// deadlock. It returns the positions in the batch (from 1) of the keys
// whose rows it skipped, whose counts are kept for the next flush; a key
// whose row is gone (forgotten, swept) or not recorded is neither counted
// nor returned.
//
// The id alone finds a key's row, as it does for a lease's writes: two
// scopes whose ids collided (SHA-256 truncated to 128 bits) would add to
// one count, which decides nothing; reads of a key compare its scope too.
// The plan must stay linear in the batch: the rows are found through the
// primary key by id = ANY($1), and the UPDATE joins the locked rows on the
// id, an index scan each, with no array in its condition to scan again per
// row. It runs with a custom plan (customPlan): a generic plan, which
// PostgreSQL picks for a statement prepared by name (pgx's
// QueryExecModeCacheStatement) after five runs, takes each array for ten
// elements, and joins a batch of a thousand keys to its rows in nested
// loops, a million comparisons (BenchmarkReplayFlush shows it).
const replayFlush = `WITH locked AS (
    SELECT k.id, u.n, u.at, u.i
    FROM unnest($1::uuid[], $2::bigint[], $3::timestamptz[]) WITH ORDINALITY AS u(id, n, at, i)
    JOIN idempotency_keys k ON k.id = u.id
    WHERE k.id = ANY($1::uuid[]) AND k.status = 'recorded'
    ORDER BY k.id
    FOR UPDATE OF k SKIP LOCKED),
counted AS (
    UPDATE idempotency_keys k
    SET replays = k.replays + l.n, last_replayed_at = greatest(k.last_replayed_at, l.at)
    FROM locked l
    WHERE k.id = l.id
    RETURNING l.i)
SELECT u.i FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, i)
WHERE u.i NOT IN (SELECT i FROM counted)
  AND u.id IN (SELECT k.id FROM idempotency_keys k WHERE k.id = ANY($1::uuid[]) AND k.status = 'recorded')`

// customPlan makes the rest of the transaction plan each statement for
// its parameters (see replayFlush).
const customPlan = "SELECT set_config('plan_cache_mode', 'force_custom_plan', true)"

// replayCount is what waits to be written of one key's replays.
type replayCount struct {
	n    int64
	last time.Time
}

func (c replayCount) add(d replayCount) replayCount {
	c.n += d.n
	if d.last.After(c.last) {
		c.last = d.last
	}
	return c
}

// replays counts a Store's replays in memory and writes them in batches.
// CountReplay takes mu alone, for a map update: it never waits for a
// flush, whose statements run without mu.
type replays struct {
	store    *Store
	interval time.Duration
	batch    int
	keep     int // most keys whose counts are kept

	// flushing admits one flush at a time, the store's own or
	// FlushReplays's.
	flushing chan struct{}

	mu      sync.Mutex
	pending map[store.Scope]replayCount
	// armed: a timer will start a flush; gen tells it whether it is still
	// the one armed. running: a flush the store started runs, and arms
	// the timer again when it ends, unless it failed (see background).
	armed, running bool
	gen            uint64
	timer          *time.Timer
}

func newReplays(s *Store, o options) *replays {
	return &replays{
		store:    s,
		interval: o.replayInterval,
		batch:    o.replayBatch,
		keep:     replayKeptBatches * o.replayBatch,
		flushing: make(chan struct{}, 1),
		pending:  make(map[store.Scope]replayCount),
	}
}

// CountReplay implements [store.ReplayCounter]: it adds the replay to a
// count kept in memory, by the store's clock ([WithClock]) or else the
// process's, and returns; no statement runs on the replay's path. The
// counts are written in batches ([WithReplayFlush]), by a goroutine of
// their own, and at [Store.FlushReplays]: a server that stops without
// calling it, or crashes, loses the counts of its last moments (at most
// an interval's, while the database writes them). A key whose row is
// deleted, taken over or no longer recorded by the time its count is
// written is not counted.
func (s *Store) CountReplay(k store.Scope) {
	at := time.Now()
	if s.clock != nil {
		at = s.clock()
	}
	r := s.replays
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.addLocked(k, replayCount{n: 1, last: at}) {
		return
	}
	switch {
	case r.running:
		// The flush arms the timer when it ends.
	case len(r.pending) >= r.batch:
		r.disarmLocked()
		r.running = true
		go r.background()
	case !r.armed:
		r.armLocked()
	}
}

// addLocked adds c to k's count, and reports whether it was kept: the
// count of a key that waits already always is, that of a further key only
// while fewer than r.keep wait.
func (r *replays) addLocked(k store.Scope, c replayCount) bool {
	old, ok := r.pending[k]
	if !ok && len(r.pending) >= r.keep {
		return false
	}
	r.pending[k] = old.add(c)
	return true
}

func (r *replays) armLocked() {
	r.armed = true
	r.gen++
	gen := r.gen
	r.timer = time.AfterFunc(r.interval, func() { r.fire(gen) })
}

func (r *replays) disarmLocked() {
	if r.armed {
		r.timer.Stop()
		r.armed = false
		r.gen++ // a timer that fired meanwhile does nothing
	}
}

// fire starts the flush a timer was armed for, unless it was disarmed or
// replaced since.
func (r *replays) fire(gen uint64) {
	r.mu.Lock()
	if !r.armed || gen != r.gen || r.running {
		r.mu.Unlock()
		return
	}
	r.armed = false
	r.running = true
	r.mu.Unlock()
	r.background()
}

// background flushes, again at once while full batches wait and the
// flushes succeed, and then arms the timer for the counts left, if any
// (those of rows it skipped, and those counted meanwhile). After a flush
// that failed it arms nothing: the next count does, so that a store whose
// database is gone, or whose pool closed at shutdown, stops trying until
// it is used again.
func (r *replays) background() {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), replayFlushTimeout)
		err := r.flush(ctx)
		cancel()
		r.mu.Lock()
		if err == nil && len(r.pending) >= r.batch {
			r.mu.Unlock()
			continue
		}
		r.running = false
		if err == nil && len(r.pending) > 0 && !r.armed {
			r.armLocked()
		}
		r.mu.Unlock()
		return
	}
}

// FlushReplays implements [store.ReplayCounter]: it writes every count
// kept in memory, in batches of at most [WithReplayFlush]'s size, each a
// transaction of its own on its key's shard, under the lock timeout. It
// waits for a flush that runs already to end first. A batch that fails
// keeps its counts for the next flush, and its error is returned (joined
// with the others'); a key whose row another transaction holds locked is
// skipped and kept for the next flush without an error. Call it at
// shutdown, once the server has stopped taking calls and before closing
// the pool.
func (s *Store) FlushReplays(ctx context.Context) error {
	return s.replays.flush(ctx)
}

// flush writes what pending holds when it starts, one flush at a time.
func (r *replays) flush(ctx context.Context) error {
	select {
	case r.flushing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.flushing }()
	r.mu.Lock()
	taken := r.pending
	r.pending = make(map[store.Scope]replayCount, len(taken))
	r.mu.Unlock()
	if len(taken) == 0 {
		return nil
	}

	shards := make(map[*pgxpool.Pool]*replayBatch)
	var errs []error
	for k, c := range taken {
		pool, err := r.store.shardOf(k.Tenant)
		if err != nil {
			continue // no shard holds the key now: its count has nowhere to go
		}
		b := shards[pool]
		if b == nil {
			b = &replayBatch{}
			shards[pool] = b
		}
		b.add(k, c)
		if len(b.keys) == r.batch {
			errs = append(errs, r.write(ctx, pool, b))
			*b = replayBatch{}
		}
	}
	for pool, b := range shards {
		if len(b.keys) > 0 {
			errs = append(errs, r.write(ctx, pool, b))
		}
	}
	return errors.Join(errs...)
}

// replayBatch is the statement's arguments for a batch of keys.
type replayBatch struct {
	keys   []store.Scope
	ids    []pgtype.UUID
	counts []int64
	lasts  []time.Time
}

func (b *replayBatch) add(k store.Scope, c replayCount) {
	b.keys = append(b.keys, k)
	b.ids = append(b.ids, scopeOf(k).id)
	b.counts = append(b.counts, c.n)
	b.lasts = append(b.lasts, c.last)
}

// write runs replayFlush for b on pool, and keeps for the next flush the
// counts it did not write: all of them when it fails, else those of the
// rows it skipped.
func (r *replays) write(ctx context.Context, pool *pgxpool.Pool, b *replayBatch) error {
	skipped, err := r.store.writeReplays(ctx, pool, b)
	if err != nil {
		skipped = skipped[:0]
		for i := range b.keys {
			skipped = append(skipped, int64(i+1))
		}
		err = fmt.Errorf("postgres: writing the counts of %d keys' replays: %w", len(b.keys), err)
	}
	if len(skipped) == 0 {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, i := range skipped {
		r.addLocked(b.keys[i-1], replayCount{n: b.counts[i-1], last: b.lasts[i-1]})
	}
	return err
}

// writeReplays runs replayFlush for b in a transaction of its own on pool,
// under the lock timeout, and returns the positions of the keys it
// skipped.
func (s *Store) writeReplays(ctx context.Context, pool *pgxpool.Pool, b *replayBatch) (skipped []int64, err error) {
	conn, err := s.acquire(ctx, pool)
	if err != nil {
		return nil, err
	}
	defer func() { _ = abandon(ctx, conn) }() // rolls back what failed
	br, _, err := s.sendBounded(ctx, conn.Conn(), s.modeOf(pool), true, []*pgx.QueuedQuery{
		{SQL: customPlan},
		{SQL: replayFlush, Arguments: []any{b.ids, b.counts, b.lasts}},
		{SQL: "COMMIT"},
	})
	if err != nil {
		return nil, pgerr.Interpret(err)
	}
	defer func() {
		if cerr := br.Close(); err == nil {
			err = pgerr.Interpret(cerr)
		}
	}()
	if _, err := br.Exec(); err != nil { // customPlan
		return nil, pgerr.Interpret(err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, pgerr.Interpret(err)
	}
	skipped, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, pgerr.Interpret(err)
	}
	tag, err := br.Exec()
	if err != nil {
		return nil, pgerr.Interpret(err)
	}
	if tag.String() != "COMMIT" {
		return nil, errors.New("postgres: the replays' counts were rolled back")
	}
	return skipped, nil
}
