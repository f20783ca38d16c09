package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres/internal/pgerr"
)

// Store keeps idempotency keys in the table idempotency_keys (see
// [Migrate]) and runs each claimed request in one transaction with the
// handler's writes. It is safe for concurrent use.
type Store struct {
	shards []*pgxpool.Pool
	route  func(tenant string) int // nil: every tenant on shards[0]
	ttl    time.Duration
	clock  func() time.Time // nil: the database's clock
	// auditRetention is how long an entry of the audit trail is kept.
	auditRetention time.Duration

	lockTimeout       time.Duration
	lockTimeoutMillis string
	setLockTimeout    string

	// modes holds the QueryExecMode each pool's connections are configured
	// with, read once: sendBounded sends by it.
	modes map[*pgxpool.Pool]pgx.QueryExecMode

	replays *replays // the replays counted and not yet written
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Finishing = (*Store)(nil)
)

// New returns a Store on pool. The claim always runs on pool, so point it at
// the primary, never a read replica. The pool's QueryExecMode
// (ConnConfig.DefaultQueryExecMode, read once, here) is honoured, so a pool
// configured for a transaction-mode connection pooler works as it is.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	return newStore([]*pgxpool.Pool{pool}, nil, opts)
}

// NewSharded returns a Store for tenants whose data lives in several
// databases, the shards: route returns the index in shards of the tenant's
// shard, and everything the store does for a key runs on that shard's pool.
// The claim, the handler's writes through [TxFromContext] and the record
// are one transaction on one database, so they commit together or not at
// all as with [New]; a lease and each of its later writes go to the shard
// that holds it. [Store.Abandoned] and [Store.Check] look at every shard.
//
// route must be stable: a tenant's keys live with its data, so route must
// send a tenant to the shard that holds its rows for as long as they are
// there (see docs/shards.md for moving a tenant). It is called for every
// claim and lease, from many goroutines at once. An index out of range
// (-1, say, for a tenant that is not served here, or is being moved), a
// nil pool or a nil route fails the call with an error that wraps
// [ErrNoShard] before any database is touched; the engine answers
// UNAVAILABLE with a retry delay. So does a route that panics: the panic
// is recovered, and its value is in the error (which the engine logs,
// and never shows the client).
//
// Each shard needs idem's schema ([Migrate] it) and, to delete expired
// keys, a [Sweeper] of its own; an inbox (package inbox) records a
// message's id on the shard whose data the message changes. Point every pool at its shard's
// primary. NewSharded keeps a copy of shards.
func NewSharded(shards []*pgxpool.Pool, route func(tenant string) int, opts ...Option) *Store {
	if route == nil {
		route = func(string) int { return -1 }
	}
	return newStore(slices.Clone(shards), route, opts)
}

// The errors of this package's own, beside package store's.
var (
	// ErrNoShard reports a tenant for which the route of a sharded Store
	// (see [NewSharded]) gave no shard: an index out of range, a nil
	// pool, or a panic of the route. Nothing was sent to any database. It
	// is none of package store's sentinel errors, so the engine answers
	// UNAVAILABLE and clients retry later: a route may refuse a tenant for
	// a while, on purpose, while it moves.
	ErrNoShard = errors.New("postgres: the shard route gave no shard for the tenant")

	// ErrTxOwned is returned by Commit and Rollback of the transaction
	// from [TxFromContext]: idem's engine commits it, together with the
	// recorded response, when the handler returns.
	ErrTxOwned = errors.New("postgres: the transaction holds the idempotency key and commits when the handler returns; return an error to discard its writes")
)

// shardOf returns the pool of tenant's shard. A route that panics is the
// tenant's error, not the process's: the panic is turned into an error
// that wraps ErrNoShard and quotes the panic's value.
func (s *Store) shardOf(tenant string) (*pgxpool.Pool, error) {
	if s.route == nil {
		return s.shards[0], nil
	}
	i, err := s.routeOf(tenant)
	if err != nil {
		return nil, err
	}
	if i < 0 || i >= len(s.shards) {
		return nil, fmt.Errorf("%w: the route returned %d, and the store has %d shards", ErrNoShard, i, len(s.shards))
	}
	if s.shards[i] == nil {
		return nil, fmt.Errorf("%w: the route returned %d, whose pool is nil", ErrNoShard, i)
	}
	return s.shards[i], nil
}

// routeOf calls the route for tenant, recovering from its panic.
func (s *Store) routeOf(tenant string) (i int, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: the route panicked: %v", ErrNoShard, p)
		}
	}()
	return s.route(tenant), nil
}

func newStore(shards []*pgxpool.Pool, route func(string) int, opts []Option) *Store {
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	modes := make(map[*pgxpool.Pool]pgx.QueryExecMode, len(shards))
	for _, pool := range shards {
		if pool != nil {
			modes[pool] = pool.Config().ConnConfig.DefaultQueryExecMode
		}
	}
	s := &Store{
		modes:             modes,
		shards:            shards,
		route:             route,
		ttl:               o.ttl,
		clock:             o.now,
		auditRetention:    o.audit,
		lockTimeout:       o.lockTimeout,
		lockTimeoutMillis: strconv.FormatInt(o.lockTimeout.Milliseconds(), 10),
		// The session's lock_timeout is kept in idem.lock_timeout, so that
		// restoreLockTimeout can put it back before the handler runs: the
		// bound applies to the claim (and, set again, to the record), not
		// to the handler's statements.
		// Both settings last until the transaction ends, as SET LOCAL
		// would.
		setLockTimeout: fmt.Sprintf("SELECT set_config('idem.lock_timeout', current_setting('lock_timeout'), true), set_config('lock_timeout', '%d', true)",
			o.lockTimeout.Milliseconds()),
	}
	s.replays = newReplays(s, o)
	return s
}

// modeOf returns the QueryExecMode of pool's connections.
func (s *Store) modeOf(pool *pgxpool.Pool) pgx.QueryExecMode {
	return s.modes[pool]
}

const (
	// lockTable takes, at the start of the claim, the table lock that
	// recording the outcome needs, without waiting for it: behind a lock
	// that keeps writers out (a CREATE INDEX, a LOCK TABLE, a migration) a
	// claim gives up at once (store.ErrInUse, so the client retries
	// later), rather than run the handler and then wait without a bound to
	// record. Every later statement of the claim's finds the table locked
	// already.
	lockTable = "LOCK TABLE idempotency_keys IN ROW EXCLUSIVE MODE NOWAIT"

	// tryKey tries to take the transaction-scoped advisory lock that
	// serializes the claims of a key, without waiting: when another claim
	// of the key holds it, the claim waits for it in a round trip of its
	// own (waitKey). $1 and $2 are the lock's keys.
	// It also returns the claim's time ($3, or now(): see [Store.now]), by
	// which the record computes the key's expiry.
	tryKey = "SELECT pg_try_advisory_xact_lock($1, $2), coalesce($3::timestamptz, now())"

	// waitKey waits for the key's advisory lock, for at most the lock
	// timeout ($3, in milliseconds), and then puts the session's
	// lock_timeout back. The items of a SELECT list are evaluated in order.
	waitKey = `SELECT set_config('idem.lock_timeout', current_setting('lock_timeout'), true),
    set_config('lock_timeout', $3, true),
    pg_advisory_xact_lock($1, $2),
    set_config('lock_timeout', current_setting('idem.lock_timeout'), true)`

	// lockKey takes the key's advisory lock, under the transaction's lock
	// timeout, unless the key is recorded and unexpired: for the claims
	// that write at once, a leased claim and an error recorded afresh. $7 is
	// the time (see [Store.now]).
	lockKey = `SELECT pg_advisory_xact_lock($2, $3)
WHERE NOT EXISTS (
    SELECT FROM idempotency_keys
    WHERE id = $1 AND tenant = $4 AND method = $5 AND key = $6
      AND status = 'recorded' AND expires_at > coalesce($7::timestamptz, now()))`

	// selectEntry reads the key's row, after the key's lock was tried or
	// taken: as a statement of its own, so that its snapshot (under READ
	// COMMITTED) sees what the lock's previous holder committed. $1 is the
	// scope's id, $2 to $4 the scope, which every read compares, so that two
	// keys whose ids collide never see each other's row. $5 is the time
	// (see [Store.now]).
	selectEntry = `SELECT status, request_hash, response_code, response, response_not_cached, expires_at,
    expires_at <= coalesce($5::timestamptz, now()),
    CASE WHEN status = 'in_progress' AND locked_until > coalesce($5::timestamptz, now())
        THEN extract(epoch FROM locked_until - coalesce($5::timestamptz, now())) ELSE 0 END
FROM idempotency_keys
WHERE id = $1 AND tenant = $2 AND method = $3 AND key = $4`

	// The records write the key's one row, recorded, just before COMMIT:
	// an INSERT where the claim found no row, the takeover of a row that
	// expired, or, for an error recorded afresh, either. The primary key is
	// the guarantee: if the key's row exists and has not expired (a claim
	// got past the lock, as one whose snapshot predates the lock's previous
	// holder's commit does), the insert fails with a unique violation or a
	// serialization failure, or the statement writes nothing. Writing
	// nothing, like a trigger or row-level security policy that keeps the
	// write from taking, must fail inside the transaction, since COMMIT is
	// pipelined behind: the message is cast to int, which fails with
	// SQLSTATE 22P02; it depends on count(*), so the planner cannot fold it
	// into an error of every execution. Plain SQL, no function of ours.
	recordColumns = `(id, tenant, method, key, request_hash, status, response_code, response, response_not_cached, expires_at)
    VALUES ($1, $2, $3, $4, $5, 'recorded', $6, $7, $8, coalesce($10::timestamptz, now()) + $9 * interval '1 second')`
	recordTakeover = `
    SET tenant = excluded.tenant, method = excluded.method, key = excluded.key,
        request_hash = excluded.request_hash, status = 'recorded',
        response_code = excluded.response_code, response = excluded.response,
        response_not_cached = excluded.response_not_cached,
        created_at = now(), updated_at = now(), expires_at = excluded.expires_at,
        locked_until = NULL, fencing_token = NULL, step_names = NULL, step_results = NULL,
        replays = 0, last_replayed_at = NULL
    WHERE k.expires_at <= coalesce($10::timestamptz, now())`
	recordCheck = `
    RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
    ELSE ('idem: recording the outcome wrote ' || count(*) || ' rows of idempotency_keys, want 1')::int END
FROM recorded`

	recordInsert = `WITH recorded AS (
    INSERT INTO idempotency_keys ` + recordColumns + recordCheck
	recordOver = `WITH recorded AS (
    INSERT INTO idempotency_keys AS k ` + recordColumns + `
    ON CONFLICT (id) DO UPDATE` + recordTakeover + recordCheck
)

// Claim implements [store.Store]. A claim costs one round trip: BEGIN, the
// table's lock, a try of the key's lock and the read of the key's row
// travel together, and the transaction stays open for the handler. A claim
// that finds the key recorded answers after that round trip, and rolls
// its transaction back in the background before the connection returns to
// the pool. One that finds the key's lock taken by a claim still running
// waits for it in a second round trip. The first claim on a connection
// costs more, and so does every claim in pgx's cache_describe and
// describe_exec modes (see the package's overview).
//
// A claim waits at most the lock timeout for a connection of the pool, too:
// claims that wait for a key's lock hold their connections meanwhile, and
// without the bound every other request, whatever its key, would queue
// behind them for as long as the key's owner runs. When no connection comes
// free in time, Claim fails with an error that is none of store's sentinels
// (the engine answers UNAVAILABLE), having changed nothing.
//
// An optimistic claim (store.ClaimRequest.Optimistic) costs the transaction's
// BEGIN alone and reads nothing: its record decides, and fails with
// store.ErrConflict where the key has a row (see the package's overview).
//
// A key that breaks the rules of [store.Scope.Validate] fails with
// [store.ErrInvalidScope] before any statement is sent: the rules keep every
// key within what the table's text columns can hold. On a sharded store
// (see [NewSharded]) the claim runs on the tenant's shard, and a tenant the
// route gives no shard fails with [ErrNoShard], also before any statement.
func (s *Store) Claim(ctx context.Context, key store.Scope, r store.ClaimRequest) (store.Claim, error) {
	if err := key.Validate(); err != nil {
		return store.Claim{}, err
	}
	pool, err := s.shardOf(key.Tenant)
	if err != nil {
		return store.Claim{}, err
	}
	sc := scopeOf(key)
	conn, err := s.acquire(ctx, pool)
	if err != nil {
		return store.Claim{}, err
	}
	mode := s.modeOf(pool)
	at := s.now()
	if r.Optimistic {
		return s.claimOptimistic(ctx, conn, mode, sc, key, r, at)
	}
	tx, entry, now, err := s.claim(ctx, conn.Conn(), mode, sc, key, at)
	switch {
	case err != nil:
		_ = abandon(ctx, conn)
		return store.Claim{}, pgerr.Interpret(err)
	case entry != nil && !entry.expired:
		// The answer is settled: give it now, and roll back meanwhile.
		go func() { _ = abandon(ctx, conn) }()
		return store.Claim{Entry: &entry.Entry}, nil
	}
	ttl := s.ttlOf(r.TTL)
	t := &txn{store: s, conn: conn, mode: mode, key: key, scope: sc, fp: r.Fingerprint, ttl: ttl.Seconds(), now: at, takeover: entry != nil}
	t.tx = &guardedTx{Tx: tx, closed: &t.closed}
	return store.Claim{Txn: t, ExpiresAt: now.Add(ttl)}, nil
}

// claimOptimistic begins the claim's transaction and reads nothing: the
// record decides (see [txn.recordOptimistic]). The claim's expiry is
// reported by the store's clock ([WithClock]), else by the process's: the
// key's row gets the database's, which no statement has read yet.
func (s *Store) claimOptimistic(ctx context.Context, conn *pgxpool.Conn, mode pgx.QueryExecMode, sc scope, key store.Scope, r store.ClaimRequest, at any) (store.Claim, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		_ = abandon(ctx, conn)
		return store.Claim{}, pgerr.Interpret(err)
	}
	now, ok := at.(time.Time)
	if !ok {
		now = time.Now()
	}
	ttl := s.ttlOf(r.TTL)
	t := &txn{store: s, conn: conn, mode: mode, key: key, scope: sc, fp: r.Fingerprint, ttl: ttl.Seconds(), now: at, optimistic: true}
	t.tx = &guardedTx{Tx: tx, closed: &t.closed}
	return store.Claim{Txn: t, ExpiresAt: now.Add(ttl)}, nil
}

// now is the time a statement takes for now, its parameter: nil, for
// which it reads the database's clock (now(), the start of its
// transaction), unless [WithClock] set a clock of the store's own.
func (s *Store) now() any {
	if s.clock == nil {
		return nil
	}
	return s.clock()
}

// ttlOf is how long an entry claimed with ttl is kept.
func (s *Store) ttlOf(ttl time.Duration) time.Duration {
	if ttl > 0 {
		return ttl
	}
	return s.ttl
}

// errPoolBusy reports that no connection came free within the lock timeout.
var errPoolBusy = errors.New("postgres: no connection of the pool came free within the lock timeout")

// acquire takes a connection from pool, waiting at most the lock timeout.
func (s *Store) acquire(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, s.lockTimeout)
	defer cancel()
	conn, err := pool.Acquire(actx)
	if err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		// The bound ran out, not the caller's deadline: report it as
		// such, not as the caller's context.DeadlineExceeded.
		return nil, errPoolBusy
	}
	return conn, err
}

// claim sends the claim's batch on conn and, when the key's lock was taken
// and its answer is not settled, waits for it; it leaves the transaction
// open. It returns the transaction, the entry found (nil when the key
// has no row) and the claim's time, at (see [Store.now]) or the database's.
func (s *Store) claim(ctx context.Context, conn *pgx.Conn, mode pgx.QueryExecMode, sc scope, key store.Scope, at any) (tx pgx.Tx, entry *foundEntry, now time.Time, err error) {
	br, tx, err := s.sendBounded(ctx, conn, mode, false, []*pgx.QueuedQuery{
		{SQL: lockTable},
		{SQL: tryKey, Arguments: []any{lockClass, sc.lock, at}},
		{SQL: selectEntry, Arguments: []any{sc.id, key.Tenant, key.Method, key.Key, at}},
	})
	if err != nil {
		return nil, nil, now, err
	}
	var locked bool
	if _, err = br.Exec(); err == nil { // lockTable
		if err = br.QueryRow().Scan(&locked, &now); err == nil {
			entry, err = scanEntry(br.QueryRow())
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	settled := entry != nil && entry.State == store.Recorded && !entry.expired
	if err != nil || locked || settled {
		// A recorded key needs no lock: its replays run side by side.
		return tx, entry, now, err
	}
	// Another claim of the key holds its lock: wait, and read what it left.
	br = conn.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{
		{SQL: waitKey, Arguments: []any{lockClass, sc.lock, s.lockTimeoutMillis}},
		{SQL: selectEntry, Arguments: []any{sc.id, key.Tenant, key.Method, key.Key, at}},
	}})
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := br.Exec(); err != nil { // waitKey
		return nil, nil, now, err
	}
	if entry, err = scanEntry(br.QueryRow()); err != nil {
		return nil, nil, now, err
	}
	return tx, entry, now, nil
}

type foundEntry struct {
	store.Entry
	expired bool
}

// scanEntry reads the row of selectEntry; it returns nil when there is none.
func scanEntry(row pgx.Row) (*foundEntry, error) {
	var (
		e      foundEntry
		status string
		rcode  *int32
		lease  float64
	)
	err := row.Scan(&status, &e.Fingerprint, &rcode, &e.Outcome.Body, &e.Outcome.NotCached, &e.ExpiresAt, &e.expired, &lease)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	}
	switch status {
	case "recorded":
		e.State = store.Recorded
	case "in_progress":
		e.State = store.InProgress
	default:
		return nil, fmt.Errorf("postgres: idempotency key has unknown status %q", status)
	}
	if rcode != nil {
		e.Outcome.Code = code.Code(*rcode)
	}
	e.LeaseRemaining = time.Duration(lease * float64(time.Second))
	return &e, nil
}

// abandon rolls back whatever transaction conn has open and returns conn to
// the pool (see release). A connection that cannot be rolled back is
// closed instead of being reused, which ends its transaction too.
func abandon(ctx context.Context, conn *pgxpool.Conn) error {
	defer release(conn)
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, "ROLLBACK")
	return err
}

// cleanupTimeout bounds a ROLLBACK sent after the request's context ended.
const cleanupTimeout = 5 * time.Second

// release returns conn to its pool, or, if pgx has closed it (its server
// stopped answering, or a context ended in the middle of a statement),
// takes it out of the pool at once. pgxpool keeps the place of a closed
// connection it destroys until pgx has finished closing it, and pgx waits
// up to 15 s for a server that no longer answers (a primary cut off by a
// network partition, its connection neither answering nor closed) to take
// a cancel request and the connection's end: with a pool of a few
// connections, the store would wait that long for one, although the
// server that new connections reach (through a proxy, or the next host of
// a multi-host connection string) answers. pgx still finishes closing the
// connection, in the background.
func release(conn *pgxpool.Conn) {
	if conn.Conn().IsClosed() {
		conn.Hijack()
		return
	}
	conn.Release()
}

// txn is an owned claim: the open transaction that holds the key's lock.
type txn struct {
	store    *Store
	conn     *pgxpool.Conn // nil once finished
	mode     pgx.QueryExecMode
	key      store.Scope
	scope    scope
	fp       []byte
	ttl      float64 // seconds
	now      any     // the claim's time (see Store.now), which the record's transaction shares
	takeover bool    // the key's row exists, expired; the record takes it over
	// optimistic claims read nothing: a row the record finds is
	// store.ErrConflict.
	optimistic bool
	// handed: Context handed the transaction out, so that a handler may
	// have written on it.
	handed bool
	tx     *guardedTx
	closed atomic.Bool // closes tx for the handler once the claim finished
}

type txKey struct{}

func (t *txn) Context(parent context.Context) context.Context {
	t.handed = true
	return context.WithValue(parent, txKey{}, pgx.Tx(t.tx))
}

// TxFromContext returns the transaction that holds the idempotency key of
// the request being handled, so that the handler's writes commit or roll
// back together with the key and its recorded response. It reports false
// outside a keyed request.
//
// The transaction belongs to idem's engine: its Commit and Rollback return
// [ErrTxOwned] and change nothing. A handler discards its writes by
// returning an error; a nested transaction (tx.Begin, pgx.BeginFunc) runs on
// a savepoint and may commit or roll back freely. Once the call has ended,
// the transaction's methods fail with pgx.ErrTxClosed.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

func (t *txn) Record(ctx context.Context, out store.Outcome) error {
	if t.conn == nil {
		return errFinished
	}
	defer func() { _ = t.finish(ctx) }()
	switch {
	case out.Code != code.Code_OK && t.handed:
		// An error is recorded without the handler's writes. A
		// transaction never handed out holds none, and records it as
		// it would a response.
		return t.taken(pgerr.Interpret(t.recordError(ctx, out)))
	case t.optimistic:
		return t.taken(pgerr.Interpret(t.recordOptimistic(ctx, out)))
	}
	record := recordInsert
	if t.takeover {
		record = recordOver
	}
	// The handler ran under the session's lock_timeout; the record waits
	// at most the store's, set for what is left of the transaction in the
	// same round trip: a key's row that a session outside idem's lock
	// holds (an insert not yet committed, a row it locked) makes the
	// record fail with lock_not_available, store.ErrInUse, rather than wait
	// for it without a bound, and commit whenever it ends.
	br := t.conn.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{
		{SQL: t.store.setLockTimeout},
		{SQL: record, Arguments: t.recordArgs(out, t.now)},
		{SQL: "COMMIT"},
	}})
	_, err := br.Exec() // setLockTimeout
	if err == nil {
		err = readRecord(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return pgerr.Interpret(err)
}

// recordOptimistic records out for a claim that read nothing: the INSERT of
// an atomic claim's record, which fails on the primary key where the key
// has a row, live or expired (an expired row is rare, and the atomic claim
// that follows the conflict takes it over: a takeover here would make
// every record pay for ON CONFLICT). Its waits are bounded by the lock
// timeout, set in the same round trip: behind an uncommitted row of the
// key (a duplicate's record, a claim in leased mode), and, since no
// statement of the transaction has locked the table yet, behind a table
// lock, while the server parses it too ([Store.sendInTx]).
func (t *txn) recordOptimistic(ctx context.Context, out store.Outcome) error {
	br, err := t.store.sendInTx(ctx, t.conn.Conn(), t.mode, []*pgx.QueuedQuery{
		{SQL: recordInsert, Arguments: t.recordArgs(out, t.now)},
		{SQL: "COMMIT"},
	})
	if err != nil {
		return err
	}
	err = readRecord(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// taken reports err, a record's, as store.ErrConflict where an optimistic
// claim's record wrote no row (a recorded error's, whose INSERT takes an
// expired row over, found it live); a unique violation on the key's row is
// store.ErrConflict already.
func (t *txn) taken(err error) error {
	if t.optimistic && errors.Is(err, errNotRecorded) {
		return fmt.Errorf("%w: %w", store.ErrConflict, err)
	}
	return err
}

// recordArgs are the arguments of a record of out at now (see [Store.now]).
func (t *txn) recordArgs(out store.Outcome, now any) []any {
	return []any{t.scope.id, t.key.Tenant, t.key.Method, t.key.Key, t.fp,
		int32(out.Code), out.Body, out.NotCached, t.ttl, now}
}

// recordError records a deterministic error without the handler's writes:
// it rolls the claim's transaction back, and records the error in a
// transaction of its own, under the key's lock taken again. Rolling back
// first, rather than to a savepoint taken before the handler ran, saves
// every claim a statement and the handler's writes a subtransaction; a
// duplicate that takes the key in between runs the handler too, and of the
// two, whichever records first stands: the other's record writes nothing
// and fails, and its caller's retry replays.
func (t *txn) recordError(ctx context.Context, out store.Outcome) error {
	if err := t.tx.Tx.Rollback(ctx); err != nil {
		return err
	}
	// A transaction of its own, with a time of its own.
	now := t.store.now()
	br, _, err := t.store.sendBounded(ctx, t.conn.Conn(), t.mode, true, []*pgx.QueuedQuery{
		{SQL: lockKey, Arguments: []any{t.scope.id, lockClass, t.scope.lock, t.key.Tenant, t.key.Method, t.key.Key, now}},
		{SQL: recordOver, Arguments: t.recordArgs(out, now)},
		{SQL: "COMMIT"},
	})
	if err != nil {
		return err
	}
	if _, err = br.Exec(); err == nil { // lockKey
		err = readRecord(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// readRecord reads the results of a record and the COMMIT behind it.
func readRecord(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		if pgerr.Code(err) == pgerr.InvalidTextRepresentation {
			return fmt.Errorf("%w: %w", errNotRecorded, err)
		}
		return err
	}
	tag, err := br.Exec()
	if err != nil {
		return err
	}
	// COMMIT of a transaction that an earlier error aborted reports
	// ROLLBACK instead of failing.
	if tag.String() != "COMMIT" {
		return errors.New("postgres: transaction was aborted by an earlier error; nothing was committed")
	}
	return nil
}

func (t *txn) Release(ctx context.Context) error {
	if t.conn == nil {
		return nil
	}
	return t.finish(ctx)
}

// finish closes the handler's view of the transaction and gives the
// connection back, rolling back whatever is still open.
func (t *txn) finish(ctx context.Context) error {
	t.closed.Store(true)
	err := abandon(ctx, t.conn)
	t.conn = nil
	return err
}

var errFinished = errors.New("postgres: claim already finished")

// errNotRecorded reports a record that wrote no row, which rolled the
// claim's transaction back.
var errNotRecorded = errors.New("postgres: recording the outcome wrote no row of idempotency_keys (the key's row exists and has not expired, or a trigger or row-level security policy kept the write from taking); nothing was committed")
