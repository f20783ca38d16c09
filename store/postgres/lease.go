package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/internal/stepset"
	"github.com/idemkit/idem/store/postgres/internal/pgerr"
)

const (
	// leaseClaim inserts the key with a lease and a fencing token ($8), or
	// takes over a row that expired (starting afresh) or whose lease ran out
	// under a request with the same fingerprint (keeping its steps). A takeover replaces the token, which fences off the earlier
	// owner. When neither applies it returns no row and leaves the row as it
	// is. Tokens are random 63-bit numbers, so that no owner of a key ever
	// gets a token an earlier owner held, even after the row was deleted
	// and inserted again. It runs after lockKey, so it never meets an
	// atomic claim of the key still running.
	//
	// Its last columns tell a takeover from a fresh claim (an insert, and
	// the takeover of an expired row, leave takeovers at 0; a takeover of a
	// run-out lease counts one more) and whether the row keeps a request
	// for a finisher. $13 is the time (see [Store.now]).
	leaseClaim = `INSERT INTO idempotency_keys AS k
    (id, tenant, method, key, request_hash, expires_at, locked_until, fencing_token,
     request_method, request_payload, request_header_names, request_header_values)
VALUES ($1, $2, $3, $4, $5, coalesce($13::timestamptz, now()) + $6 * interval '1 second', coalesce($13::timestamptz, now()) + $7 * interval '1 second', $8, $9, $10, $11, $12)
ON CONFLICT (id) DO UPDATE
SET tenant = excluded.tenant, method = excluded.method, key = excluded.key,
    request_hash = excluded.request_hash, status = 'in_progress',
    response_code = NULL, response = NULL, response_not_cached = false,
    locked_until = excluded.locked_until,
    fencing_token = excluded.fencing_token,
    updated_at = now(),
    created_at = CASE WHEN k.expires_at <= coalesce($13::timestamptz, now()) THEN now() ELSE k.created_at END,
    expires_at = CASE WHEN k.expires_at <= coalesce($13::timestamptz, now()) THEN excluded.expires_at ELSE k.expires_at END,
    step_names = CASE WHEN k.expires_at <= coalesce($13::timestamptz, now()) THEN NULL ELSE k.step_names END,
    step_results = CASE WHEN k.expires_at <= coalesce($13::timestamptz, now()) THEN NULL ELSE k.step_results END,
    takeovers = CASE WHEN k.expires_at <= coalesce($13::timestamptz, now()) THEN 0 ELSE k.takeovers + 1 END,
    replays = 0, last_replayed_at = NULL,
    request_method = coalesce(excluded.request_method, k.request_method),
    request_payload = coalesce(excluded.request_payload, k.request_payload),
    request_header_names = CASE WHEN excluded.request_method IS NULL THEN k.request_header_names
        ELSE excluded.request_header_names END,
    request_header_values = CASE WHEN excluded.request_method IS NULL THEN k.request_header_values
        ELSE excluded.request_header_values END
WHERE k.expires_at <= coalesce($13::timestamptz, now())
   OR (k.status = 'in_progress' AND k.locked_until <= coalesce($13::timestamptz, now()) AND k.request_hash = excluded.request_hash
       AND k.tenant = excluded.tenant AND k.method = excluded.method AND k.key = excluded.key)
RETURNING step_names, step_results, expires_at, takeovers > 0, request_method IS NOT NULL`

	// The statements of a held lease. Each matches the row only while its
	// fencing token is current, the claim unfinished and the key unexpired.
	// The id alone finds the row; the tenant ($3) is there for engines that
	// distribute the table by tenant (Citus), where a statement that names
	// the tenant runs on that tenant's shard only, not on every shard.
	// $4 is the time (see [Store.now]).
	leaseWhere = ` WHERE id = $1 AND fencing_token = $2 AND tenant = $3
    AND status = 'in_progress' AND expires_at > coalesce($4::timestamptz, now())`
	leaseExtend = `UPDATE idempotency_keys SET locked_until = coalesce($4::timestamptz, now()) + $5 * interval '1 second'` + leaseWhere
	// leaseSave writes every step.
	leaseSave = `UPDATE idempotency_keys SET step_names = $5, step_results = $6, updated_at = now()` + leaseWhere
	// leaseRecord also drops what was kept for a finisher: the request
	// is not kept past its outcome.
	leaseRecord = `UPDATE idempotency_keys
SET status = 'recorded', response_code = $5, response = $6, response_not_cached = $7,
    locked_until = NULL, updated_at = now(),
    request_method = NULL, request_payload = NULL,
    request_header_names = NULL, request_header_values = NULL` + leaseWhere
	leaseRelease = `DELETE FROM idempotency_keys` + leaseWhere
	// leaseEnd ends the lease of a claim that has saved steps or keeps its
	// request for a finisher, instead of deleting it, so that a retry or a
	// finisher takes over (and resumes).
	leaseEnd = `UPDATE idempotency_keys SET locked_until = coalesce($4::timestamptz, now()), updated_at = now()` + leaseWhere
)

// maxLeaseRounds bounds the rounds of a leased claim that finds the key's
// row gone between its statements (its earlier owner released it, or the
// sweeper deleted it).
const maxLeaseRounds = 3

// ClaimLeased implements [store.Store]. The claim is one round trip (BEGIN, the
// lock timeout, the key's advisory lock, the insert or takeover, the read
// of the holder and COMMIT travel together; the first claim on a connection
// costs more, as for Claim) and commits at once; each later write of the
// lease is one statement in a transaction of its own, one round trip, whose
// lock waits the lock timeout bounds: behind a lock on the key's row or the
// table it gives up with an error that wraps [store.ErrInUse] (not
// store.ErrLeaseLost: the lease is still the caller's). The lease's
// expires_at is set on the first claim and kept by takeovers. Like Claim,
// it refuses a key that breaks the rules of [store.Scope.Validate] with
// [store.ErrInvalidScope], and waits at most the lock timeout for a
// connection of the pool. On a sharded store (see [NewSharded]) the claim
// and every later write of its ClaimLeased run on the tenant's shard, and a
// tenant the route gives no shard fails with [ErrNoShard]. A key whose
// saved steps cannot be read (step_names and step_results do not pair up,
// or a name is NULL) fails with an error wrapping [store.ErrCorrupt], and its lease is ended
// at once, so that every claim of it fails so, until the row is deleted
// or expires.
func (s *Store) ClaimLeased(ctx context.Context, key store.Scope, r store.LeaseRequest) (store.LeasedClaim, error) {
	if err := key.Validate(); err != nil {
		return store.LeasedClaim{}, err
	}
	pool, err := s.shardOf(key.Tenant)
	if err != nil {
		return store.LeasedClaim{}, err
	}
	sc := scopeOf(key)
	for range maxLeaseRounds {
		l, expiresAt, entry, err := s.lease(ctx, pool, sc, key, r)
		switch {
		case errors.Is(err, store.ErrCorrupt):
			// The takeover that found the steps unreadable committed:
			// end its lease at once, so that the next claim finds them
			// as this one did, not the key in use. Never delete the row:
			// its steps may have run.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			_ = l.exec(cctx, leaseEnd)
			cancel()
			return store.LeasedClaim{}, err
		case err != nil:
			return store.LeasedClaim{}, pgerr.Interpret(err)
		case l != nil:
			return store.LeasedClaim{Lease: l, ExpiresAt: expiresAt, TookOver: l.tookOver}, nil
		case entry != nil && !entry.expired:
			return store.LeasedClaim{Entry: &entry.Entry}, nil
		}
		// The row the insert met was deleted, or expired, between the
		// insert and the select: try again.
	}
	return store.LeasedClaim{}, store.ErrInUse
}

// lease runs one round of ClaimLeased. When the key's steps cannot be
// decoded it returns an error wrapping store.ErrCorrupt together with the
// lease its committed takeover holds.
func (s *Store) lease(ctx context.Context, pool *pgxpool.Pool, sc scope, key store.Scope, r store.LeaseRequest) (l *lease, expiresAt time.Time, entry *foundEntry, err error) {
	token := rand.Int64()
	conn, err := s.acquire(ctx, pool)
	if err != nil {
		return nil, expiresAt, nil, err
	}
	now := s.now()
	// A connection left inside a transaction by a failed batch is closed,
	// not reused (see release).
	defer release(conn)
	br, _, err := s.sendBounded(ctx, conn.Conn(), s.modeOf(pool), true, []*pgx.QueuedQuery{
		{SQL: lockKey, Arguments: []any{sc.id, lockClass, sc.lock, key.Tenant, key.Method, key.Key, now}},
		{SQL: leaseClaim, Arguments: append(append([]any{sc.id, key.Tenant, key.Method, key.Key, r.Fingerprint, s.ttlOf(r.TTL).Seconds(), r.Lease.Seconds(), token},
			callArgs(r.Call)...), now)},
		{SQL: selectEntry, Arguments: []any{sc.id, key.Tenant, key.Method, key.Key, now}},
		{SQL: "COMMIT"},
	})
	if err != nil {
		return nil, expiresAt, nil, err
	}
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := br.Exec(); err != nil { // lockKey
		return nil, expiresAt, nil, err
	}
	var (
		names    []*string // a NULL name only in a damaged row
		results  [][]byte
		tookOver bool
		kept     bool
		corrupt  error // the steps are unreadable: store.ErrCorrupt
	)
	err = br.QueryRow().Scan(&names, &results, &expiresAt, &tookOver, &kept)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, expiresAt, nil, err
	default:
		l = &lease{store: s, pool: pool, id: sc.id, tenant: key.Tenant, token: token, tookOver: tookOver, kept: kept}
		if l.steps, err = readSteps(names, results); err != nil {
			corrupt = fmt.Errorf("%w: %w", store.ErrCorrupt, err)
		}
	}
	if entry, err = scanEntry(br.QueryRow()); err != nil {
		return nil, expiresAt, nil, err
	}
	tag, err := br.Exec()
	if err != nil {
		return nil, expiresAt, nil, err
	}
	if tag.String() != "COMMIT" {
		return nil, expiresAt, nil, errors.New("postgres: lease claim was rolled back")
	}
	if corrupt != nil {
		return l, expiresAt, nil, corrupt
	}
	if l != nil {
		return l, expiresAt, nil, nil
	}
	return nil, expiresAt, entry, nil
}

// lease is a held leased claim.
type lease struct {
	store    *Store
	pool     *pgxpool.Pool // of the key's shard
	id       pgtype.UUID
	tenant   string
	token    int64
	tookOver bool // the claim took the key over from an earlier owner
	kept     bool // the row keeps the request for a finisher

	// ended is set once the lease is no longer its holder's to write
	// under: a write found it lost (no later write can match the row
	// again, as tokens are never reused), or its Record or Release took
	// effect (a released row may still hold the token). Later writes fail
	// with store.ErrLeaseLost without a round trip.
	ended atomic.Bool

	mu       sync.Mutex
	steps    []store.Step
	finished bool // Record took effect or found the lease lost, or Release was called
}

func (l *lease) SaveStep(ctx context.Context, p store.Step) error {
	// Refused before the round trip: a step name the text column cannot
	// hold would otherwise fail with the driver's error.
	if err := p.Validate(); err != nil {
		return err
	}
	p.Result = append([]byte(nil), p.Result...)
	l.mu.Lock()
	defer l.mu.Unlock()
	steps, err := stepset.Merge(l.steps, p)
	if err != nil {
		return err
	}
	names, results := stepArrays(steps)
	if err := l.exec(ctx, leaseSave, names, results); err != nil {
		return err
	}
	l.steps = steps
	return nil
}

func (l *lease) Steps() []store.Step {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]store.Step, len(l.steps))
	for i, p := range l.steps {
		out[i] = store.Step{Name: p.Name, Result: slices.Clone(p.Result)}
	}
	return out
}

// callArgs are the arguments of leaseClaim that keep c: NULLs for
// none, which a takeover leaves as they are.
func callArgs(c *store.Call) []any {
	if c == nil {
		return []any{nil, nil, nil, nil}
	}
	names, values := headerArrays(c.Metadata)
	return []any{c.Method, c.Request, names, values}
}

// abandoned finds leased calls kept for a finisher whose lease ran out
// more than $1 × 2^takeovers seconds ago (at most 2^16) by the time $3
// (see [Store.now]), and which have not expired; those another
// transaction holds are skipped.
const abandoned = `SELECT tenant, method, key, request_hash, request_method, request_payload,
    request_header_names, request_header_values, takeovers
FROM idempotency_keys
WHERE status = 'in_progress' AND request_payload IS NOT NULL
  AND locked_until <= coalesce($3::timestamptz, now()) - $1 * power(2, least(takeovers, 16)) * interval '1 second'
  AND expires_at > coalesce($3::timestamptz, now())
ORDER BY locked_until
LIMIT $2`

// Abandoned implements [store.Finishing]. A sharded store (see
// [NewSharded]) asks every shard at once for up to limit calls and takes
// them in turn, one of each shard's at a time, up to limit in all, so that
// no shard starves the others. When some shards fail, or have not answered
// when ctx ends, it returns the calls the others found together with an
// error that names those shards by index: one shard that cannot be reached
// does not keep the calls of the others from being finished. Each shard's
// listing waits at most the lock timeout ([WithLockTimeout]) for a
// connection of its pool, as a claim does; the query itself runs under
// ctx, so bound ctx (idem's Finisher does, per pass) to bound
// a shard that stops answering on a connection already open.
//
// A call whose kept metadata or method cannot be read (a damaged row) is
// listed with [store.AbandonedCall].Unreadable set, without its metadata; the
// other calls are listed as usual.
func (s *Store) Abandoned(ctx context.Context, grace time.Duration, limit int) ([]store.AbandonedCall, error) {
	if len(s.shards) == 1 {
		return s.abandonedOn(ctx, s.shards[0], grace, limit)
	}
	found := make([][]store.AbandonedCall, len(s.shards))
	errs := make([]error, len(s.shards))
	var wg sync.WaitGroup
	for i, pool := range s.shards {
		if pool == nil {
			continue // no tenant's key can be there
		}
		wg.Go(func() {
			var err error
			if found[i], err = s.abandonedOn(ctx, pool, grace, limit); err != nil {
				errs[i] = fmt.Errorf("postgres: shard %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	var out []store.AbandonedCall
	for round := 0; len(out) < limit; round++ {
		took := false
		for _, f := range found {
			if round < len(f) && len(out) < limit {
				out = append(out, f[round])
				took = true
			}
		}
		if !took {
			break
		}
	}
	return out, errors.Join(errs...)
}

// abandonedOn lists the abandoned calls of one database. A row whose kept
// request cannot be read is listed with Unreadable set: it must not hide
// the others.
func (s *Store) abandonedOn(ctx context.Context, pool *pgxpool.Pool, grace time.Duration, limit int) ([]store.AbandonedCall, error) {
	if pool == nil {
		return nil, nil // no tenant's key can be there
	}
	conn, err := s.acquire(ctx, pool)
	if err != nil {
		return nil, err
	}
	defer release(conn)
	rows, err := conn.Query(ctx, abandoned, grace.Seconds(), limit, s.now())
	if err != nil {
		return nil, pgerr.Interpret(err)
	}
	defer rows.Close()
	var out []store.AbandonedCall
	for rows.Next() {
		var (
			a      store.AbandonedCall
			method *string   // NULL only in a damaged row
			names  []*string // NULL elements only in a damaged row
			values [][]byte
		)
		// Every column scans into a type that takes any value it can
		// hold: a failed Scan would end the whole listing.
		if err := rows.Scan(&a.Scope.Tenant, &a.Scope.Method, &a.Scope.Key, &a.Fingerprint,
			&method, &a.Call.Request, &names, &values, &a.Takeovers); err != nil {
			return nil, err
		}
		a.Unreadable = readKept(&a.Call, method, names, values)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, pgerr.Interpret(err)
	}
	return out, nil
}

func (l *lease) Extend(ctx context.Context, d time.Duration) error {
	return l.exec(ctx, leaseExtend, d.Seconds())
}

// Record fails with store.ErrLeaseLost once the lease ended, a second
// Record included: see exec.
func (l *lease) Record(ctx context.Context, out store.Outcome) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.exec(ctx, leaseRecord, int32(out.Code), out.Body, out.NotCached); err != nil {
		// Unless the lease was lost, the claim is still ours: a deferred
		// Release deletes it (or finds it recorded, if the record was
		// committed and only its answer lost).
		l.finished = l.finished || errors.Is(err, store.ErrLeaseLost)
		return err
	}
	l.finished = true
	l.ended.Store(true)
	return nil
}

func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return nil
	}
	l.finished = true
	// The request may have ended with its context; the claim must still go.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	// The lease is given up, whatever the statement's fate: no later
	// write may extend it or save a step (a row kept for a retry holds
	// the token still).
	defer l.ended.Store(true)
	if len(l.steps) > 0 || l.kept {
		return l.exec(ctx, leaseEnd)
	}
	return l.exec(ctx, leaseRelease)
}

// exec runs a statement guarded by the lease's token and reports
// store.ErrLeaseLost when it matched no row, then and from then on, and
// at once, without a round trip, once the lease ended.
//
// The statement runs in a transaction of its own under the lock timeout,
// as a claim does (see [Store.sendBounded]): BEGIN, the lock timeout, the
// statement and COMMIT travel together in one round trip. Behind a lock on
// the key's row (a session outside idem's lock that holds it) or on the
// table, the write gives up after the lock timeout with store.ErrInUse,
// having changed nothing, rather than wait for as long as ctx lets it and
// then, its caller gone, take effect whenever the lock ends. It waits at
// most the lock timeout for a connection of the pool, too.
func (l *lease) exec(ctx context.Context, sql string, args ...any) error {
	if l.ended.Load() {
		return store.ErrLeaseLost
	}
	conn, err := l.store.acquire(ctx, l.pool)
	if err != nil {
		return err
	}
	defer func() { _ = abandon(ctx, conn) }() // rolls back what failed
	br, _, err := l.store.sendBounded(ctx, conn.Conn(), l.store.modeOf(l.pool), true, []*pgx.QueuedQuery{
		{SQL: sql, Arguments: append([]any{l.id, l.token, l.tenant, l.store.now()}, args...)},
		{SQL: "COMMIT"},
	})
	if err != nil {
		return pgerr.Interpret(err)
	}
	tag, err := br.Exec()
	if err == nil {
		var commit pgconn.CommandTag
		if commit, err = br.Exec(); err == nil && commit.String() != "COMMIT" {
			err = errors.New("postgres: the write of a lease was rolled back")
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return pgerr.Interpret(err)
	}
	if tag.RowsAffected() == 0 {
		l.ended.Store(true)
		return store.ErrLeaseLost
	}
	return nil
}
