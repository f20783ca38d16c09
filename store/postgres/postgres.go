package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
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
		pool:        pool,
		ttl:         o.ttl.Seconds(),
		lockTimeout: o.lockTimeout,
		// The session's lock_timeout is kept in idem.lock_timeout, so that
		// lockKey can put it back once the claim has its lock: the bound
		// applies to the claim, not to the handler's statements. Both
		// settings last until the transaction ends, as SET LOCAL would.
		setLockTimeout: fmt.Sprintf("SELECT set_config('idem.lock_timeout', current_setting('lock_timeout'), true), set_config('lock_timeout', '%d', true)",
			o.lockTimeout.Milliseconds()),
	}
}

const (
	// lockTable takes the table lock that recording the outcome needs, at
	// the start of the claim, under the lock timeout: behind a lock that
	// keeps writers out (a CREATE INDEX, a LOCK TABLE, a migration) a claim
	// gives up after the lock timeout, rather than run the handler and then
	// wait without a bound to record.
	lockTable = "LOCK TABLE idempotency_keys IN ROW EXCLUSIVE MODE"

	// lockKey serializes the claims of one key: it takes a
	// transaction-scoped advisory lock on the key's scope, waiting for at
	// most the lock timeout. A key already completed (and unexpired) needs
	// no lock, since its answer is settled: the replays of a key run side by
	// side. The lock is an optimization, never the guarantee: the primary
	// key of idempotency_keys is (see record). $1 is the scope's id, $2 and
	// $3 the lock's keys, $4 to $6 the scope.
	lockKey = `SELECT pg_advisory_xact_lock($2, $3)
WHERE NOT EXISTS (
    SELECT FROM idempotency_keys
    WHERE id = $1 AND tenant = $4 AND method = $5 AND key = $6
      AND status = 'completed' AND expires_at > now())`

	// selectEntry reads the key's row. It runs as a statement of its own
	// after lockKey, so its snapshot (under READ COMMITTED) sees what the
	// lock's previous holder committed. It compares the whole scope: two
	// keys whose ids collide never see each other's row.
	selectEntry = `SELECT status, request_hash, response_code, response, response_not_cached, expires_at,
    expires_at <= now(),
    CASE WHEN status = 'in_progress' AND locked_until > now()
        THEN extract(epoch FROM locked_until - now()) ELSE 0 END
FROM idempotency_keys
WHERE id = $1 AND tenant = $2 AND method = $3 AND key = $4`

	// claimEntry is selectEntry for an atomic claim, which also puts the
	// session's lock_timeout back before the handler runs: the bound is the
	// claim's. It returns one row, of NULLs when the key has none.
	claimEntry = `SELECT set_config('lock_timeout', current_setting('idem.lock_timeout'), true),
    k.status, k.request_hash, k.response_code, k.response, k.response_not_cached, k.expires_at,
    k.expires_at <= now(),
    CASE WHEN k.status = 'in_progress' AND k.locked_until > now()
        THEN extract(epoch FROM k.locked_until - now()) ELSE 0 END
FROM (VALUES (1)) one
LEFT JOIN idempotency_keys k ON k.id = $1 AND k.tenant = $2 AND k.method = $3 AND k.key = $4`

	// savepoint separates the claim from the handler's writes, so that a
	// recorded error can discard the writes and keep the claim's lock.
	savepoint         = "SAVEPOINT idem_claim"
	rollbackSavepoint = "ROLLBACK TO SAVEPOINT idem_claim"

	// record writes the key's one row, completed, just before COMMIT: an
	// INSERT, or the takeover of a row that expired. The primary key is the
	// guarantee: if the key's row exists and has not expired (a concurrent
	// claim got past the lock, as one whose snapshot predates the lock's
	// previous holder's commit does under REPEATABLE READ), the insert
	// fails with a unique violation or a serialization failure, or updates
	// nothing. Updating nothing, like a trigger or row-level security policy
	// that keeps the insert from taking, must fail inside the transaction,
	// since COMMIT is pipelined behind: the message is cast to int, which
	// fails with SQLSTATE 22P02; it depends on count(*), so the planner
	// cannot fold it into an error of every execution. Plain SQL, no
	// function of ours.
	record = `WITH recorded AS (
    INSERT INTO idempotency_keys AS k
        (id, tenant, method, key, request_hash, status, response_code, response, response_not_cached, expires_at)
    VALUES ($1, $2, $3, $4, $5, 'completed', $6, $7, $8, now() + $9 * interval '1 second')
    ON CONFLICT (id) DO UPDATE
    SET tenant = excluded.tenant, method = excluded.method, key = excluded.key,
        request_hash = excluded.request_hash, status = 'completed',
        response_code = excluded.response_code, response = excluded.response,
        response_not_cached = excluded.response_not_cached,
        created_at = now(), updated_at = now(), expires_at = excluded.expires_at,
        locked_until = NULL, fencing_token = NULL, recovery_point = NULL, recovery_data = NULL
    WHERE k.expires_at <= now()
    RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
    ELSE ('idem: recording the outcome wrote ' || count(*) || ' rows of idempotency_keys, want 1')::int END
FROM recorded`
)

// Claim implements [store.Store]. A claim costs one round trip: BEGIN, the
// lock timeout, the table's and the key's locks, the read of its row and a
// savepoint travel together, and the transaction stays open for the
// handler. A claim that finds the key completed answers after that round
// trip too, and rolls its transaction back in the background before the
// connection returns to the pool. The first claim on a connection costs
// three round trips more (see the package's overview).
//
// A claim waits at most the lock timeout for a connection of the pool, too:
// claims that wait for a key's lock hold their connections meanwhile, and
// without the bound every other request, whatever its key, would queue
// behind them for as long as the key's owner runs. When no connection comes
// free in time, Claim fails with an error that is none of store's sentinels
// (the interceptor answers UNAVAILABLE), having changed nothing.
//
// A key that breaks the rules of [store.Key.Validate] fails with
// [store.ErrInvalidKey] before any statement is sent: the rules keep every
// key within what the table's text columns can hold.
func (s *Store) Claim(ctx context.Context, key store.Key, fingerprint []byte) (store.Claim, error) {
	if err := key.Validate(); err != nil {
		return store.Claim{}, err
	}
	sc := scopeOf(key)
	conn, err := s.acquire(ctx)
	if err != nil {
		return store.Claim{}, err
	}
	tx, entry, err := s.claim(ctx, conn.Conn(), sc, key)
	switch {
	case err != nil:
		_ = abandon(ctx, conn)
		return store.Claim{}, interpretError(err)
	case entry != nil && !entry.expired:
		// The answer is settled: give it now, and roll back meanwhile.
		go func() { _ = abandon(ctx, conn) }()
		return store.Claim{Entry: &entry.Entry}, nil
	}
	t := &txn{conn: conn, key: key, scope: sc, fp: fingerprint, ttl: s.ttl}
	t.tx = &guardedTx{Tx: tx, closed: &t.closed}
	return store.Claim{Txn: t}, nil
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

// claim sends the claim's batch on conn: the key's lock, the read of its
// row and the savepoint, in a transaction that it leaves open. It returns
// the transaction and the entry found (nil when the key has no row).
func (s *Store) claim(ctx context.Context, conn *pgx.Conn, sc scope, key store.Key) (tx pgx.Tx, entry *foundEntry, err error) {
	br, tx, err := s.sendBounded(ctx, conn, []*pgx.QueuedQuery{
		{SQL: lockTable},
		{SQL: lockKey, Arguments: []any{sc.id, lockClass, sc.lock, key.Tenant, key.Method, key.Key}},
		{SQL: claimEntry, Arguments: []any{sc.id, key.Tenant, key.Method, key.Key}},
		{SQL: savepoint},
	})
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	for range 2 { // lockTable, lockKey
		if _, err := br.Exec(); err != nil {
			return nil, nil, err
		}
	}
	if entry, err = scanEntry(br.QueryRow(), true); err != nil {
		return nil, nil, err
	}
	if _, err := br.Exec(); err != nil { // SAVEPOINT
		return nil, nil, err
	}
	return tx, entry, nil
}

type foundEntry struct {
	store.Entry
	expired bool
}

// scanEntry reads the row of selectEntry, or of claimEntry when claim is
// set; it returns nil when the key has none.
func scanEntry(row pgx.Row, claim bool) (*foundEntry, error) {
	var (
		e         foundEntry
		status    *string
		code      *int32
		notCached *bool
		expiresAt *time.Time
		expired   *bool
		lease     *float64
		dest      = []any{&status, &e.Fingerprint, &code, &e.Outcome.Body, &notCached, &expiresAt, &expired, &lease}
	)
	if claim {
		dest = append([]any{nil}, dest...) // the restored lock_timeout
	}
	err := row.Scan(dest...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	case status == nil:
		return nil, nil // claimEntry's row without a key row
	}
	e.Outcome.NotCached, e.ExpiresAt, e.expired = *notCached, *expiresAt, *expired
	switch *status {
	case "completed":
		e.State = store.Completed
	case "in_progress":
		e.State = store.InProgress
	default:
		return nil, fmt.Errorf("postgres: idempotency key has unknown status %q", *status)
	}
	if code != nil {
		e.Outcome.Code = codes.Code(*code)
	}
	e.LeaseRemaining = time.Duration(*lease * float64(time.Second))
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

// txn is an owned claim: the open transaction that holds the key's lock.
type txn struct {
	conn   *pgxpool.Conn // nil once finished
	key    store.Key
	scope  scope
	fp     []byte
	ttl    float64
	tx     *guardedTx
	closed atomic.Bool // closes tx for the handler once the claim finished
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
// a savepoint and may commit or roll back freely. Once the call has ended,
// the transaction's methods fail with pgx.ErrTxClosed.
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
	b.Queue(record, t.scope.id, t.key.Tenant, t.key.Method, t.key.Key, t.fp,
		int32(out.Code), out.Body, out.NotCached, t.ttl)
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
	t.closed.Store(true)
	err := abandon(ctx, t.conn)
	t.conn = nil
	return err
}

var errFinished = errors.New("postgres: claim already finished")

// errNotRecorded reports a record that wrote no row, which rolled the
// claim's transaction back.
var errNotRecorded = errors.New("postgres: recording the outcome wrote no row of idempotency_keys (the key's row exists and has not expired, or a trigger or row-level security policy kept the write from taking); nothing was committed")
