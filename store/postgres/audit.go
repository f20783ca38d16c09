package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres/internal/pgerr"
)

const (
	// adminLock locks the key's row, so that an audited write's statement
	// reads the row as it changes it: nobody else can change it between.
	adminLock = `SELECT 1 FROM idempotency_keys
WHERE id = $1 AND tenant = $2 AND method = $3 AND key = $4
FOR UPDATE`

	// adminStateOf is the state of the key's row by the time $6, the
	// admin writes' time parameter.
	adminStateOf = `SELECT CASE
    WHEN expires_at <= coalesce($6::timestamptz, now()) THEN 'expired'
    WHEN status = 'recorded' THEN 'recorded'
    WHEN locked_until > coalesce($6::timestamptz, now()) THEN 'in_progress'
    ELSE 'abandoned' END AS state
FROM idempotency_keys
WHERE id = $1 AND tenant = $2 AND method = $3 AND key = $4`

	// auditInsert adds an entry to idem_audit: $1 is the time (NULL for
	// the database's clock), $2 the retention, $3 the key's id, $4 to $6
	// its scope, $7 the action, $8 the operator, $9 the reason, $10
	// force, $11 and $12 the states before and after, $13 the request id
	// and $14 the peer.
	auditInsert = `INSERT INTO idem_audit (at, expires_at, key_id, tenant, method, key, action, operator, reason, forced,
    state_before, state_after, request_id, peer)
VALUES (coalesce($1::timestamptz, now()), coalesce($1::timestamptz, now()) + $2::interval, $3, $4, $5, $6, $7, $8, $9, $10,
    $11, nullif($12::text, ''), $13, $14)`

	// auditList reads a page of idem_audit in the order (at, id), after
	// ($8, $9) when $8 is set: every tenant's with $1, else tenant $2's;
	// of method $3 unless it is empty; of the key whose id is $5 and key
	// $4 unless $4 is empty; at in [$6, $7), each bound unless NULL; at
	// most $10 of them.
	auditList = `SELECT id, at, tenant, method, key, action, operator, reason, forced,
    state_before, coalesce(state_after, ''), request_id, peer
FROM idem_audit
WHERE ($1::boolean OR tenant = $2)
  AND ($3::text = '' OR method = $3)
  AND ($4::text = '' OR (key_id = $5::uuid AND key = $4))
  AND ($6::timestamptz IS NULL OR at >= $6)
  AND ($7::timestamptz IS NULL OR at < $7)
  AND ($8::timestamptz IS NULL OR (at, id) > ($8, $9::uuid))
ORDER BY at, id
LIMIT $10`
)

// auditedWrites maps an admin write to its audited form: one statement
// that changes the key's row as the write does and, when it did, adds an
// entry to idem_audit with the state the row had (read in the same
// statement, of the row adminLock holds), in the transaction of the
// change. The write's parameters come first; the audited form adds, after
// them, the retention, the operator, the reason, the request id and the
// peer.
var auditedWrites = map[string]string{
	adminForget: audited(adminForget, store.ActionForget, "", 7),
	adminSettle: audited(adminSettle, store.ActionSettle, store.Recorded, 10),
}

// audited returns write's audited form (see auditedWrites); write has
// next-1 parameters.
func audited(write string, action store.AuditAction, after store.State, next int) string {
	p := func(i int) string { return fmt.Sprintf("$%d", next+i) }
	return fmt.Sprintf(`WITH old AS (%s),
changed AS (%s
RETURNING id)
INSERT INTO idem_audit (at, expires_at, key_id, tenant, method, key, action, operator, reason, forced,
    state_before, state_after, request_id, peer)
SELECT coalesce($6::timestamptz, now()), coalesce($6::timestamptz, now()) + %s::interval, $1, $2, $3, $4, '%s', %s, %s, $5,
    old.state, nullif('%s', ''), %s, %s
FROM changed, old`, adminStateOf, write, p(0), action, p(1), p(2), after, p(3), p(4))
}

// retention is the store's audit retention as a statement's parameter.
func (s *Store) retention() pgtype.Interval {
	return pgtype.Interval{Microseconds: s.auditRetention.Microseconds(), Valid: true}
}

// auditOf returns a copy of a, the audit entry of an action on k, with the
// fields the action sets, checked; nil for nil.
func auditOf(a *store.AuditEntry, k store.Scope, action store.AuditAction, force bool) (*store.AuditEntry, error) {
	if a == nil {
		return nil, nil
	}
	e := *a
	e.Scope, e.Action, e.Force, e.Before, e.After = k, action, force, store.InProgress, ""
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// AddAudit implements [store.Admin]: one INSERT into idem_audit, in a
// transaction of its own under the lock timeout, on the tenant's shard.
func (s *Store) AddAudit(ctx context.Context, e store.AuditEntry) (err error) {
	if err := e.Validate(); err != nil {
		return err
	}
	pool, err := s.shardOf(e.Scope.Tenant)
	if err != nil {
		return err
	}
	conn, err := s.acquire(ctx, pool)
	if err != nil {
		return err
	}
	defer func() { _ = abandon(ctx, conn) }()
	br, _, err := s.sendBounded(ctx, conn.Conn(), s.modeOf(pool), true, []*pgx.QueuedQuery{
		{SQL: auditInsert, Arguments: []any{s.now(), s.retention(), scopeOf(e.Scope).id, e.Scope.Tenant, e.Scope.Method, e.Scope.Key,
			string(e.Action), e.Operator, e.Reason, e.Force, string(e.Before), string(e.After), e.RequestID, e.Peer}},
		{SQL: "COMMIT"},
	})
	if err != nil {
		return pgerr.Interpret(err)
	}
	defer func() {
		if cerr := br.Close(); err == nil {
			err = pgerr.Interpret(cerr)
		}
	}()
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return pgerr.Interpret(err)
		}
	}
	return nil
}

// auditRow is a row of auditList: the entry, and where it stands in the
// order of pages.
type auditRow struct {
	store.AuditEntry
	pos position
}

// AuditLog implements [store.Admin], as [Store.Keys] lists keys: a page is
// one query, in a transaction of its own under the lock timeout, ordered by
// the entries' time (by [WithClock], or the database's clock) and then by
// their id; on a sharded store a filter of one tenant asks its shard, one
// of every tenant every shard, merged. An entry whose retention
// ([WithAuditRetention]) has passed is listed until a [Sweeper] deletes
// it.
func (s *Store) AuditLog(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, string, error) {
	if err := f.Validate(); err != nil {
		return nil, "", err
	}
	if f.AllTenants {
		f.Tenant = ""
	}
	limit := pageSize(f.Limit)
	afterAt, afterID, err := after(f.After)
	if err != nil {
		return nil, "", err
	}
	var keyID pgtype.UUID
	if f.Key != "" {
		keyID = scopeOf(store.Scope{Tenant: f.Tenant, Method: f.Method, Key: f.Key}).id
	}
	args := []any{f.AllTenants, f.Tenant, f.Method, f.Key, keyID, timeOrNull(f.Since), timeOrNull(f.Until), afterAt, afterID, limit + 1}
	pools, err := s.poolsOf(f.AllTenants, f.Tenant)
	if err != nil {
		return nil, "", err
	}
	rows, err := onEachPool(ctx, s, pools, func(ctx context.Context, pool *pgxpool.Pool) ([]auditRow, error) {
		return readAll(ctx, s, pool, scanAudit, auditList, args...)
	})
	if err != nil {
		return nil, "", err
	}
	out, next := page(rows, limit, func(r *auditRow) position { return r.pos }, func(r *auditRow) store.AuditEntry { return r.AuditEntry })
	return out, next, nil
}

func scanAudit(row pgx.Row) (auditRow, error) {
	var (
		r              auditRow
		action, before string
		after          string
	)
	err := row.Scan(&r.pos.id, &r.Time, &r.Scope.Tenant, &r.Scope.Method, &r.Scope.Key, &action, &r.Operator, &r.Reason, &r.Force,
		&before, &after, &r.RequestID, &r.Peer)
	r.pos.at = r.Time
	r.Action, r.Before, r.After = store.AuditAction(action), store.State(before), store.State(after)
	return r, err
}

// poolsOf returns the pools a filter of tenant, or of every tenant, asks.
func (s *Store) poolsOf(allTenants bool, tenant string) ([]*pgxpool.Pool, error) {
	if allTenants {
		return s.shards, nil
	}
	pool, err := s.shardOf(tenant)
	if err != nil {
		return nil, err
	}
	return []*pgxpool.Pool{pool}, nil
}

// onEachPool runs read on each of pools at once and returns what they
// read, together; a pool that fails fails the whole, with an error naming
// its shard when there are several. A nil pool (a shard no tenant is
// routed to) is skipped.
func onEachPool[T any](ctx context.Context, s *Store, pools []*pgxpool.Pool, read func(context.Context, *pgxpool.Pool) ([]T, error)) ([]T, error) {
	pages := make([][]T, len(pools))
	errs := make([]error, len(pools))
	var wg sync.WaitGroup
	for i, pool := range pools {
		if pool == nil {
			continue
		}
		wg.Go(func() {
			var err error
			if pages[i], err = read(ctx, pool); err != nil && len(pools) > 1 {
				err = fmt.Errorf("postgres: shard %d: %w", i, err)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return slices.Concat(pages...), nil
}

// readAll runs sql, a query, with args, in a transaction of its own on
// pool under the lock timeout, and reads its rows with scan.
func readAll[T any](ctx context.Context, s *Store, pool *pgxpool.Pool, scan func(pgx.Row) (T, error), sql string, args ...any) (out []T, err error) {
	conn, err := s.acquire(ctx, pool)
	if err != nil {
		return nil, err
	}
	defer func() { _ = abandon(ctx, conn) }()
	br, _, err := s.sendBounded(ctx, conn.Conn(), s.modeOf(pool), true, []*pgx.QueuedQuery{
		{SQL: sql, Arguments: args},
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
	rows, err := br.Query()
	if err != nil {
		return nil, pgerr.Interpret(err)
	}
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, pgerr.Interpret(err)
	}
	if _, err := br.Exec(); err != nil { // COMMIT
		return nil, pgerr.Interpret(err)
	}
	return out, nil
}
