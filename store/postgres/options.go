package postgres

import "time"

// The defaults of the options below.
const (
	defaultLockTimeout = 2 * time.Second
	defaultTTL         = 24 * time.Hour
	// defaultAuditRetention is how long an audit entry is kept.
	defaultAuditRetention = 90 * 24 * time.Hour
)

type options struct {
	lockTimeout time.Duration
	ttl         time.Duration
	now         func() time.Time // nil: the database's clock
	audit       time.Duration

	replayInterval time.Duration
	replayBatch    int
}

var defaultOptions = options{
	lockTimeout:    defaultLockTimeout,
	ttl:            defaultTTL,
	audit:          defaultAuditRetention,
	replayInterval: defaultReplayInterval,
	replayBatch:    defaultReplayBatch,
}

// Option configures a [Store].
type Option func(*options)

// WithLockTimeout bounds how long a claim waits for a concurrent request that
// holds the same key (SET LOCAL lock_timeout). When the wait runs out the
// claim fails with store.ErrInUse, which the engine answers with
// ABORTED and a retry hint. It bounds the claim's waits for table locks
// too (a LOCK TABLE or a migration's ALTER TABLE of idempotency_keys), on a
// new connection as on one that has claimed before. It bounds the record
// as well, and in leased mode every write of a lease (extend, save a step,
// record, release): behind the key's row that another session holds
// locked, or a table lock, they give up with store.ErrInUse. The bound
// applies to idem's statements only; the handler's own statements run
// under the session's setting. A claim, and a lease's write, also waits at
// most this long for a connection of the pool, and fails (the engine
// answers UNAVAILABLE) rather than queue behind claims that wait for a
// busy key. Default: 2 seconds. Values below one
// millisecond are raised to one millisecond, since PostgreSQL reads zero
// as "wait forever".
func WithLockTimeout(d time.Duration) Option {
	return func(o *options) { o.lockTimeout = max(d, time.Millisecond) }
}

// WithTTL sets how long a key is kept (expires_at = claim time + ttl). Past
// it the key counts as absent, so a request with that key runs again. Make it
// longer than any client's retry window, and say so in your API's contract.
// Default: 24 hours. Non-positive values select the default.
func WithTTL(ttl time.Duration) Option {
	return func(o *options) {
		if ttl <= 0 {
			ttl = defaultTTL
		}
		o.ttl = ttl
	}
}

// WithClock sets the clock by which the store's statements tell the time:
// a key's expiry, a lease's end, how long ago a lease ran out. Each
// statement is given the clock's time as a parameter in place of the
// database's now(), as river's are, so that a test can move time forward
// instead of sleeping. It must be safe for concurrent use, and every
// store that shares the database must read the same clock: two clocks
// that disagree disagree about whether a lease ran out or a key expired.
// The lock timeout and the waits for a connection are measured in real
// time, whatever the clock says; a [Sweeper] and an inbox keep the
// database's clock, and so do the columns created_at and updated_at,
// which no statement compares. Default: the database's clock
// (now(), the start of the statement's transaction), one clock for every
// server that shares the database. A nil clock selects the default.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithAuditRetention sets how long an entry of the audit trail (the table
// idem_audit, which [Store.Forget], [Store.Settle] and [Store.AddAudit]
// write and [Store.AuditLog] lists) is kept: its expires_at is its time
// plus d, and a [Sweeper] deletes it once that has passed, as it deletes
// expired keys. Default: 90 days. Non-positive values select the default.
func WithAuditRetention(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			d = defaultAuditRetention
		}
		o.audit = d
	}
}
