package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The defaults of the sweeper's options.
const (
	defaultSweepInterval  = time.Minute
	defaultSweepBatchSize = 1000
	defaultSweepPause     = 100 * time.Millisecond
	// sweepBatchTimeout bounds each batch's DELETE (see [Sweeper.Sweep]).
	sweepBatchTimeout = 30 * time.Second
)

type sweeperOptions struct {
	interval     time.Duration
	batchSize    int
	pause        time.Duration
	batchTimeout time.Duration
	observe      observeOptions
}

var defaultSweeperOptions = sweeperOptions{
	interval:     defaultSweepInterval,
	batchSize:    defaultSweepBatchSize,
	pause:        defaultSweepPause,
	batchTimeout: sweepBatchTimeout,
}

// A SweeperOption configures a [Sweeper]: [WithInterval], [WithBatchSize],
// [WithPause], [WithLogger], [WithMeterProvider] or [WithTracerProvider].
type SweeperOption func(*sweeperOptions)

// WithInterval sets how long [Sweeper.Run] waits after the end of one
// pass before it starts the next. Default: one minute. Non-positive values
// select the default.
func WithInterval(d time.Duration) SweeperOption {
	return func(o *sweeperOptions) {
		if d <= 0 {
			d = defaultSweepInterval
		}
		o.interval = d
	}
}

// WithBatchSize sets how many rows one DELETE of a [Sweeper] removes at
// most, and so how many row locks it holds until it commits. Default: 1000
// rows. Non-positive values select the default.
func WithBatchSize(n int) SweeperOption {
	return func(o *sweeperOptions) {
		if n <= 0 {
			n = defaultSweepBatchSize
		}
		o.batchSize = n
	}
}

// WithPause sets the pause between two batches of a [Sweeper]'s pass,
// which leaves room for the requests, autovacuum and replication to keep
// up. A pass therefore removes at most about one batch per pause. Default:
// 100 milliseconds. Zero means no pause; negative values are read as zero.
func WithPause(d time.Duration) SweeperOption {
	return func(o *sweeperOptions) { o.pause = max(d, 0) }
}

// Sweeper deletes expired rows of the tables idempotency_keys,
// processed_messages and idem_audit (the admin service's audit trail,
// kept for the store's [WithAuditRetention]). Expired rows already count as absent, so sweeping is
// only about space: nothing depends on when it happens.
//
// It deletes in small batches, each its own transaction, found through the
// expires_at index (a BRIN index on idempotency_keys, whose rows expire in
// about the order they were written; a B-tree on processed_messages). A
// batch locks only the expired rows it deletes and
// skips any that another transaction has locked (FOR UPDATE SKIP LOCKED):
// claims of live keys never wait for it, a claim that is taking over an
// expired row waits for at most one batch (or makes the sweeper skip that
// row), and several replicas may sweep at the same time without waiting for
// each other or deleting a row twice. The SQL joins on the primary key, not
// on physical row addresses, so it also runs on PostgreSQL-compatible
// distributed engines.
//
// A Sweeper is safe for concurrent use.
type Sweeper struct {
	pool *pgxpool.Pool
	opts sweeperOptions
	obs  *sweeperObserver
}

// NewSweeper returns a Sweeper that deletes through pool, which must reach
// the primary. Start it with [Sweeper.Run], or call [Sweeper.Sweep] from a
// scheduler of your own.
func NewSweeper(pool *pgxpool.Pool, opts ...SweeperOption) *Sweeper {
	o := defaultSweeperOptions
	for _, opt := range opts {
		opt(&o)
	}
	return &Sweeper{pool: pool, opts: o, obs: newSweeperObserver(o.observe)}
}

// sweepTable is the DELETE of one batch from one table. The inner SELECT
// finds expired rows through the expires_at index (on processed_messages
// the oldest first) and locks them, skipping rows others hold; the DELETE then removes exactly the rows
// it locked, matched by primary key. Locking a row that was changed since
// the statement began re-evaluates the inner WHERE on its newest version, so
// a row that a claim took over (and so gave a new expiry) is left alone.
// The outer expires_at condition restates that for engines that re-check
// differently.
type sweepTable struct {
	name   string
	delete string
}

var sweepTables = []sweepTable{
	{
		name: "idempotency_keys",
		delete: `DELETE FROM idempotency_keys t
USING (
    SELECT id FROM idempotency_keys
    WHERE expires_at <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
) d
WHERE t.id = d.id AND t.expires_at <= now()`,
	},
	{
		name: "processed_messages",
		delete: `DELETE FROM processed_messages t
USING (
    SELECT consumer, message_id FROM processed_messages
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
) d
WHERE t.consumer = d.consumer AND t.message_id = d.message_id
  AND t.expires_at <= now()`,
	},
	{
		// The audit trail's entries past their retention
		// (WithAuditRetention).
		name: "idem_audit",
		delete: `DELETE FROM idem_audit t
USING (
    SELECT id FROM idem_audit
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
) d
WHERE t.id = d.id AND t.expires_at <= now()`,
	},
}

// Sweep runs one pass: for each table, it deletes batches of expired rows,
// pausing between them, until a batch comes back short of the batch size
// (the expired rows are gone, or another sweeper holds the rest). It
// returns how many rows it deleted. A batch that takes longer than 30 s
// fails: it waited behind a lock (a migration's) or for a server that no
// longer answers (a primary cut off by a network partition, its
// connection not yet closed), and the next pass takes a new connection
// rather than wait for that one without end. A table that fails does not
// keep the other from being swept; the error then names the table, and
// the count still includes what was deleted. When ctx ends, Sweep stops between or
// during batches and returns ctx's error; the batches already committed
// stay deleted.
func (s *Sweeper) Sweep(ctx context.Context) (deleted int64, err error) {
	ctx, pass := s.obs.startPass(ctx)
	defer func() { pass.end(deleted, err) }()
	var errs []error
	for _, t := range sweepTables {
		n, err := s.sweep(ctx, t)
		s.obs.deleted(ctx, t.name, n)
		deleted += n
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return deleted, ctxErr
			}
			errs = append(errs, fmt.Errorf("postgres: sweeping %s: %w", t.name, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// sweep deletes expired rows of one table in batches.
func (s *Sweeper) sweep(ctx context.Context, t sweepTable) (deleted int64, err error) {
	for {
		n, err := s.batch(ctx, t)
		if err != nil {
			return deleted, err
		}
		deleted += n
		if n < int64(s.opts.batchSize) {
			return deleted, nil
		}
		if err := sleep(ctx, s.opts.pause); err != nil {
			return deleted, err
		}
	}
}

// batch deletes one batch of t's expired rows, within the batch timeout.
func (s *Sweeper) batch(ctx context.Context, t sweepTable) (int64, error) {
	bctx, cancel := context.WithTimeout(ctx, s.opts.batchTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(bctx)
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = conn.Exec(bctx, t.delete, s.opts.batchSize)
		release(conn)
	}
	if err != nil && ctx.Err() == nil && errors.Is(bctx.Err(), context.DeadlineExceeded) {
		return 0, fmt.Errorf("no answer within %v: %w", s.opts.batchTimeout, err)
	}
	return tag.RowsAffected(), err
}

// Run sweeps at once and then again each interval after a pass ended (see
// [WithInterval]), until ctx ends. A failed pass is logged at level
// ERROR (see [WithLogger]) and retried at the next interval; it does
// not stop Run. A pass that deleted rows is logged at level DEBUG. Run returns only when ctx is done, and then returns ctx.Err(),
// which is never nil: callers that stop it by cancelling ctx may ignore it.
func (s *Sweeper) Run(ctx context.Context) error {
	for {
		deleted, err := s.Sweep(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log := s.opts.observe.log()
		if err != nil {
			log.LogAttrs(ctx, slog.LevelError, "idem: sweeping expired rows failed; retrying at the next pass",
				slog.Int64("deleted", deleted), slog.Duration("next_pass", s.opts.interval), slog.String("error", err.Error()))
		} else if deleted > 0 {
			log.LogAttrs(ctx, slog.LevelDebug, "idem: swept expired rows", slog.Int64("deleted", deleted))
		}
		if err := sleep(ctx, s.opts.interval); err != nil {
			return err
		}
	}
}

// sleep waits for d, or returns ctx.Err() if ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
