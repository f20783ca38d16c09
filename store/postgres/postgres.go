package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem/store"
)

// Store keeps idempotency keys in the table idempotency_keys (see
// [Migrate]) and runs each claimed request in one transaction with the
// handler's writes. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	ttl  float64 // seconds

	lockTimeout    time.Duration
	setLockTimeout string
}

var _ store.Store = (*Store)(nil)

// New returns a Store on pool. The claim always runs on pool, so point it at
// the primary, never a read replica. The pool's QueryExecMode is honoured,
// so a pool configured for a transaction-mode connection pooler works as
// it is.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	return &Store{
		pool:           pool,
		ttl:            o.ttl.Seconds(),
		lockTimeout:    o.lockTimeout,
		setLockTimeout: fmt.Sprintf("SET LOCAL lock_timeout = %d", o.lockTimeout.Milliseconds()),
	}
}

const (
	// savepoint separates the claim from the handler's writes, so that a
	// recorded error can discard the writes and keep the claim.
	savepoint         = "SAVEPOINT idem_claim"
	rollbackSavepoint = "ROLLBACK TO SAVEPOINT idem_claim"
	resetLockTimeout  = "SET LOCAL lock_timeout TO DEFAULT"

	insertClaim = `INSERT INTO idempotency_keys (tenant, method, key, request_hash, expires_at)
VALUES ($1, $2, $3, $4, now() + $5 * interval '1 second')
ON CONFLICT (tenant, method, key) DO NOTHING
RETURNING true`

	// selectEntry runs as its own statement after insertClaim, so its
	// snapshot sees the row a conflicting transaction committed while the
	// insert waited for it.
	selectEntry = `SELECT status, request_hash, response_code, response, response_not_cached, expires_at,
    expires_at <= now(),
    CASE WHEN status = 'in_progress' AND locked_until > now()
        THEN extract(epoch FROM locked_until - now()) ELSE 0 END
FROM idempotency_keys
WHERE tenant = $1 AND method = $2 AND key = $3`

	// takeOver claims a row whose expiry has passed. A concurrent taker
	// waits on the row lock and then finds expires_at in the future.
	takeOver = `UPDATE idempotency_keys
SET request_hash = $4, status = 'in_progress', response_code = NULL, response = NULL,
    created_at = now(), updated_at = now(), expires_at = now() + $5 * interval '1 second',
    locked_until = NULL, fencing_token = NULL, recovery_point = NULL, recovery_data = NULL
WHERE tenant = $1 AND method = $2 AND key = $3 AND expires_at <= now()
RETURNING true`

	// record completes the claim, and fails when it updates no row (the
	// key's row is gone or no longer in progress, or a trigger or a
	// row-level security policy kept the update from taking): COMMIT is
	// pipelined behind it, and only an error inside the transaction stops
	// that COMMIT from committing the handler's writes with a key left in
	// progress. The error is the cast of a message to int, which fails
	// with SQLSTATE 22P02 and the message; it depends on count(*), so the
	// planner cannot fold it into an error of every execution. Plain SQL,
	// no function of ours, so it runs wherever the claim does.
	record = `WITH recorded AS (
    UPDATE idempotency_keys
    SET status = 'completed', response_code = $4, response = $5, response_not_cached = $6, updated_at = now()
    WHERE tenant = $1 AND method = $2 AND key = $3 AND status = 'in_progress'
    RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
    ELSE ('idem: recording the outcome updated ' || count(*) || ' rows of idempotency_keys, want 1')::int END
FROM recorded`
)

// maxTakeovers bounds the rounds of a claim that meets expired rows, each of
// which another request may have taken over first.
const maxTakeovers = 3

// Claim implements [store.Store]. A claim of a free key costs one round trip
// (BEGIN, the lock timeout, the insert and a savepoint travel together) and
// leaves the transaction open for the handler; a claim that finds a
// completed key costs two (the same batch, then ROLLBACK). The first claim
// on a connection costs two round trips more (see the package's
// overview).
//
// A claim waits at most the lock timeout for a connection of the pool, too:
// claims that wait for a key's row lock hold their connections meanwhile,
// and without the bound every other request, whatever its key, would queue
// behind them for as long as the key's owner runs. When no connection comes
// free in time, Claim fails with an error that is none of store's sentinels
// (the interceptor answers UNAVAILABLE), having changed nothing.
//
// A key that breaks the rules of [store.Key.Validate] fails with
// [store.ErrInvalidKey] before any statement is sent: the rules keep every
// key within what the table's text columns and primary key index can hold.
func (s *Store) Claim(ctx context.Context, key store.Key, fingerprint []byte) (store.Claim, error) {
	if err := key.Validate(); err != nil {
		return store.Claim{}, err
	}
	conn, err := s.acquire(ctx)
	if err != nil {
		return store.Claim{}, err
	}
	claimed, entry, err := s.claim(ctx, conn.Conn(), key, fingerprint)
	if err != nil || !claimed {
		_ = abandon(ctx, conn)
		if err != nil {
			return store.Claim{}, interpretError(err)
		}
		return store.Claim{Entry: entry}, nil
	}
	return store.Claim{Txn: &txn{conn: conn, key: key, tx: &tx{conn: conn.Conn()}}}, nil
}

// errPoolBusy reports that no connection came free within the lock timeout.
var errPoolBusy = errors.New("postgres: no connection of the pool came free within the lock timeout")

// acquire takes a connection from the pool, waiting at most the lock
// timeout.
func (s *Store) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, s.lockTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(actx)
	if err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		// The bound ran out, not the caller's deadline: report it as
		// such, not as the caller's context.DeadlineExceeded.
		return nil, errPoolBusy
	}
	return conn, err
}

// claim runs the claim statements on conn and leaves its transaction open.
// It reports whether the key is now owned, or else the entry that holds it
// (nil if the row vanished).
func (s *Store) claim(ctx context.Context, conn *pgx.Conn, key store.Key, fp []byte) (bool, *store.Entry, error) {
	claimed, entry, err := s.runClaim(ctx, conn, true, insertClaim, key, fp)
	for range maxTakeovers {
		if err != nil || claimed || (entry != nil && !entry.expired) {
			break
		}
		if entry == nil {
			// The row the insert met was deleted before the select read it
			// (an expired row, swept): the key is free, insert again.
			claimed, entry, err = s.runClaim(ctx, conn, false, insertClaim, key, fp)
		} else {
			// The key expired: it counts as absent, so take the row over.
			claimed, entry, err = s.runClaim(ctx, conn, false, takeOver, key, fp)
		}
	}
	switch {
	case err != nil:
		return false, nil, err
	case claimed:
		return true, nil, nil
	case entry == nil || entry.expired:
		// Other requests took the row over, or deleted it, maxTakeovers
		// times in a row.
		return false, nil, store.ErrInUse
	}
	return false, &entry.Entry, nil
}

type foundEntry struct {
	store.Entry
	expired bool
}

// runClaim sends with [Store.sendBounded], after BEGIN if begin is set and
// the lock timeout: claimSQL (insertClaim or takeOver, which return a row
// when they claimed the key), the entry's select, the lock timeout's reset
// and the savepoint. It reads the results in the same order.
func (s *Store) runClaim(ctx context.Context, conn *pgx.Conn, begin bool, claimSQL string, key store.Key, fp []byte) (claimed bool, entry *foundEntry, err error) {
	b := &pgx.Batch{}
	b.Queue(claimSQL, key.Tenant, key.Method, key.Key, fp, s.ttl)
	b.Queue(selectEntry, key.Tenant, key.Method, key.Key)
	b.Queue(resetLockTimeout)
	b.Queue(savepoint)
	br, err := s.sendBounded(ctx, conn, begin, b)
	if err != nil {
		return false, nil, err
	}
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	err = br.QueryRow().Scan(&claimed)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, nil, err
	}
	entry, err = scanEntry(br.QueryRow())
	if err != nil {
		return false, nil, err
	}
	if _, err := br.Exec(); err != nil { // reset lock_timeout
		return false, nil, err
	}
	if _, err := br.Exec(); err != nil { // SAVEPOINT
		return false, nil, err
	}
	return claimed, entry, nil
}

// scanEntry reads the row of selectEntry; it returns nil when there is none.
func scanEntry(row pgx.Row) (*foundEntry, error) {
	var (
		e      foundEntry
		status string
		code   *int32
		lease  float64
	)
	err := row.Scan(&status, &e.Fingerprint, &code, &e.Outcome.Body, &e.Outcome.NotCached, &e.ExpiresAt, &e.expired, &lease)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	}
	switch status {
	case "completed":
		e.State = store.Completed
	case "in_progress":
		e.State = store.InProgress
	default:
		return nil, fmt.Errorf("postgres: idempotency key has unknown status %q", status)
	}
	if code != nil {
		e.Outcome.Code = codes.Code(*code)
	}
	e.LeaseRemaining = time.Duration(lease * float64(time.Second))
	return &e, nil
}

// abandon rolls back whatever transaction conn has open and returns conn to
// the pool. A connection that cannot be rolled back is closed by the pool
// instead of being reused, which ends its transaction too.
func abandon(ctx context.Context, conn *pgxpool.Conn) error {
	defer conn.Release()
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

// txn is an owned claim: the open transaction that holds the key.
type txn struct {
	conn *pgxpool.Conn // nil once finished
	key  store.Key
	tx   *tx
}

type txKey struct{}

func (t *txn) Context(parent context.Context) context.Context {
	return context.WithValue(parent, txKey{}, pgx.Tx(t.tx))
}

// TxFromContext returns the transaction that holds the idempotency key of
// the request being handled, so that the handler's writes commit or roll
// back together with the key and its recorded response. It reports false
// outside a keyed request.
//
// The transaction belongs to the interceptor: its Commit and Rollback return
// [ErrTxOwned] and change nothing. A handler discards its writes by
// returning an error; a nested transaction (tx.Begin, pgx.BeginFunc) runs on
// a savepoint and may commit or roll back freely.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

func (t *txn) Complete(ctx context.Context, out store.Outcome) error {
	if t.conn == nil {
		return errFinished
	}
	defer func() { _ = t.finish(ctx) }()
	discard := out.Code != codes.OK
	if discard && t.conn.Conn().PgConn().TxStatus() == 'E' {
		// A failed statement aborted the transaction, and an aborted
		// transaction cannot even prepare the batch's statements: go back
		// to the savepoint on its own first.
		if _, err := t.conn.Exec(ctx, rollbackSavepoint); err != nil {
			return interpretError(err)
		}
		discard = false
	}
	b := &pgx.Batch{}
	if discard {
		b.Queue(rollbackSavepoint)
	}
	b.Queue(record, t.key.Tenant, t.key.Method, t.key.Key, int32(out.Code), out.Body, out.NotCached)
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	err := readComplete(br, discard)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return interpretError(err)
}

func readComplete(br pgx.BatchResults, discard bool) error {
	if discard {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	if _, err := br.Exec(); err != nil {
		if pgErrorCode(err) == invalidTextRepresentation {
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
	t.tx.closed.Store(true)
	err := abandon(ctx, t.conn)
	t.conn = nil
	return err
}

var errFinished = errors.New("postgres: claim already finished")

// errNotRecorded reports a record that updated no row, which rolled the
// claim's transaction back.
var errNotRecorded = errors.New("postgres: recording the outcome updated no row of idempotency_keys (was the row deleted, or did a trigger or row-level security policy skip the update?); nothing was committed")
