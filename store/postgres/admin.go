package postgres

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres/internal/pgerr"
)

var _ store.Admin = (*Store)(nil)

const (
	// adminColumns are the columns of a key's row that store.KeyInfo
	// holds, read by scanKeyInfo, and its state by the time $1 (see
	// [Store.now]), computed once by adminState: an expired row is
	// expired whatever its status; a row in progress is in progress while
	// its lease runs, and abandoned once it has run out (or has none).
	adminColumns = `SELECT k.id, k.tenant, k.method, k.key, st.state, k.request_hash,
    k.created_at, k.updated_at, k.expires_at, k.locked_until, k.takeovers,
    k.status, k.response_code, k.response, k.response_not_cached,
    k.step_names, k.step_results,
    k.request_method, k.request_payload, k.request_header_names, k.request_header_values,
    k.replays, k.last_replayed_at
FROM idempotency_keys k
CROSS JOIN LATERAL (SELECT CASE
    WHEN k.expires_at <= coalesce($1::timestamptz, now()) THEN 'expired'
    WHEN k.status = 'recorded' THEN 'recorded'
    WHEN k.locked_until > coalesce($1::timestamptz, now()) THEN 'in_progress'
    ELSE 'abandoned' END AS state) st`

	// adminKey reads one key's row: $2 is the scope's id, $3 to $5 the
	// scope, which every read compares.
	adminKey = adminColumns + `
WHERE k.id = $2 AND k.tenant = $3 AND k.method = $4 AND k.key = $5`

	// adminKeys reads a page of rows in the order (created_at, id), after
	// the row ($8, $9) when $8 is set: all tenants' with $2, else tenant
	// $3's; of method $4 unless it is empty; created in [$5, $6), each
	// bound unless NULL; in one of the states $7 unless it is empty; at
	// most $10 of them.
	adminKeys = adminColumns + `
WHERE ($2::boolean OR k.tenant = $3)
  AND ($4::text = '' OR k.method = $4)
  AND ($5::timestamptz IS NULL OR k.created_at >= $5)
  AND ($6::timestamptz IS NULL OR k.created_at < $6)
  AND (cardinality($7::text[]) = 0 OR st.state = ANY($7::text[]))
  AND ($8::timestamptz IS NULL OR (k.created_at, k.id) > ($8, $9::uuid))
ORDER BY k.created_at, k.id
LIMIT $10`

	// adminProbe reads what decides an admin write that changed nothing,
	// in a statement of its own after the write, so that it sees the row
	// as the write left it: whether it exists, its status, whether it
	// expired by the time $5, the end of its lease and whether the lease
	// is live then.
	adminProbe = `SELECT status, expires_at <= coalesce($5::timestamptz, now()), locked_until,
    status = 'in_progress' AND expires_at > coalesce($5::timestamptz, now())
        AND coalesce(locked_until > coalesce($5::timestamptz, now()), false)
FROM idempotency_keys
WHERE id = $1 AND tenant = $2 AND method = $3 AND key = $4`

	// adminForget deletes the key's row unless $5 (force) is false and its
	// lease is live by the time $6. The condition is the DELETE's own:
	// a row that a claim takes over meanwhile is read again, as the
	// takeover left it, once the DELETE has waited for it, so that a
	// lease taken between a look and the delete is never deleted unforced.
	adminForget = `DELETE FROM idempotency_keys
WHERE id = $1 AND tenant = $2 AND method = $3 AND key = $4
  AND ($5::boolean OR status <> 'in_progress' OR locked_until IS NULL
       OR locked_until <= coalesce($6::timestamptz, now()) OR expires_at <= coalesce($6::timestamptz, now()))`

	// adminSettle records $7 to $9 as the outcome of the key's unexpired
	// row in progress whose lease is not live by the time $6, or whatever
	// its lease with $5 (force). As a record that takes a key over, it
	// ends the lease, clears the fencing token (so that the holder's later
	// writes match nothing), and drops the steps and the request kept for
	// a finisher; it keeps the expiry and the count of takeovers.
	adminSettle = `UPDATE idempotency_keys
SET status = 'recorded', response_code = $7, response = $8, response_not_cached = $9,
    locked_until = NULL, fencing_token = NULL, updated_at = now(),
    step_names = NULL, step_results = NULL, request_method = NULL, request_payload = NULL,
    request_header_names = NULL, request_header_values = NULL
WHERE id = $1 AND tenant = $2 AND method = $3 AND key = $4
  AND status = 'in_progress' AND expires_at > coalesce($6::timestamptz, now())
  AND ($5::boolean OR locked_until IS NULL OR locked_until <= coalesce($6::timestamptz, now()))`
)

// The bounds of a page of [Store.Keys] and [Store.AuditLog].
const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// pageSize returns the entries a page of a filter's limit holds: the
// default for none, at most the maximum.
func pageSize(limit int) int {
	switch {
	case limit <= 0:
		return defaultPageSize
	case limit > maxPageSize:
		return maxPageSize
	}
	return limit
}

// Key implements [store.Admin]. It reads the key's row in a transaction
// of its own under the lock timeout, on the tenant's shard. A row whose
// steps or kept request cannot be read fails with an error wrapping
// [store.ErrCorrupt]: forget the key once its side effects are checked.
func (s *Store) Key(ctx context.Context, k store.Scope) (store.KeyInfo, error) {
	if err := k.Validate(); err != nil {
		return store.KeyInfo{}, err
	}
	pool, err := s.shardOf(k.Tenant)
	if err != nil {
		return store.KeyInfo{}, err
	}
	sc := scopeOf(k)
	infos, err := s.readKeys(ctx, pool, adminKey, s.now(), sc.id, k.Tenant, k.Method, k.Key)
	switch {
	case err != nil:
		return store.KeyInfo{}, err
	case len(infos) == 0:
		return store.KeyInfo{}, store.ErrNotFound
	}
	return infos[0].KeyInfo, nil
}

// Keys implements [store.Admin]. A page is one query, in a transaction of
// its own under the lock timeout, ordered by the rows' created_at (by the
// database's clock, whatever [WithClock] says) and then by id. The cursor
// is the last row's (created_at, id), which no other row shares, so that
// a page starts where the previous one ended even as rows come and go.
//
// On a sharded store (see [NewSharded]) a filter of one tenant asks that
// tenant's shard only; one of all tenants asks every shard for a page,
// at once, and merges them in the same order, so that the cursor works
// across shards. A shard that fails fails the page, with an error naming
// it. A row whose steps or kept request cannot be read fails the page with
// an error wrapping [store.ErrCorrupt] that names its key; narrow the
// filter's creation times to page around it. A filter that fails
// [store.KeyFilter.Validate] (a NUL byte, which no text column holds, say)
// is refused with its error before any query.
func (s *Store) Keys(ctx context.Context, f store.KeyFilter) ([]store.KeyInfo, string, error) {
	if err := f.Validate(); err != nil {
		return nil, "", err
	}
	if f.AllTenants {
		f.Tenant = "" // ignored, and not checked: it must not reach a query
	}
	limit := pageSize(f.Limit)
	afterAt, afterID, err := after(f.After)
	if err != nil {
		return nil, "", err
	}
	states := make([]string, len(f.States))
	for i, st := range f.States {
		states[i] = string(st)
	}
	args := []any{s.now(), f.AllTenants, f.Tenant, f.Method, timeOrNull(f.CreatedAfter), timeOrNull(f.CreatedBefore),
		states, afterAt, afterID, limit + 1}

	pools, err := s.poolsOf(f.AllTenants, f.Tenant)
	if err != nil {
		return nil, "", err
	}
	rows, err := onEachPool(ctx, s, pools, func(ctx context.Context, pool *pgxpool.Pool) ([]keyRow, error) {
		return s.readKeys(ctx, pool, adminKeys, args...)
	})
	if err != nil {
		return nil, "", err
	}
	out, next := page(rows, limit, func(r *keyRow) position { return r.pos }, func(r *keyRow) store.KeyInfo { return r.KeyInfo })
	return out, next, nil
}

// after returns the position a page token's cursor names, as a query's
// parameters: a nil time and a null id for the first page.
func after(cursor string) (at any, id pgtype.UUID, err error) {
	if cursor == "" {
		return nil, id, nil
	}
	p, err := decodeCursor(cursor)
	if err != nil {
		return nil, id, err
	}
	return p.at, p.id, nil
}

// page merges rows, read from one or more shards with one row more than
// limit each, into a page: it sorts them by pos and keeps the first limit,
// and returns their entries (item) and the cursor of the next page, ""
// when no row is left.
func page[R, T any](rows []R, limit int, pos func(*R) position, item func(*R) T) ([]T, string) {
	slices.SortFunc(rows, func(a, b R) int { return pos(&a).compare(pos(&b)) })
	next := ""
	if len(rows) > limit {
		rows = rows[:limit]
		next = pos(&rows[limit-1]).encode()
	}
	out := make([]T, len(rows))
	for i := range rows {
		out[i] = item(&rows[i])
	}
	return out, next
}

// timeOrNull is t as a statement's parameter: NULL for the zero time.
func timeOrNull(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// keyRow is a row of adminColumns: what it holds, and where it stands in
// the order of pages.
type keyRow struct {
	store.KeyInfo
	pos position
}

// position is a row's place in the order of pages: its created_at, then
// its id.
type position struct {
	at time.Time
	id pgtype.UUID
}

func (p position) compare(q position) int {
	if c := p.at.Compare(q.at); c != 0 {
		return c
	}
	return bytes.Compare(p.id.Bytes[:], q.id.Bytes[:])
}

// cursorVersion is the first byte of a cursor: its layout, then the
// created_at in microseconds since 1970 (PostgreSQL's precision) as a
// big-endian int64, and the id's 16 bytes.
const (
	cursorVersion = 1
	cursorLen     = 1 + 8 + 16
)

func (p position) encode() string {
	b := make([]byte, 0, cursorLen)
	b = append(b, cursorVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(p.at.UnixMicro()))
	b = append(b, p.id.Bytes[:]...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (position, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != cursorLen || b[0] != cursorVersion {
		return position{}, store.ErrInvalidCursor
	}
	p := position{at: time.UnixMicro(int64(binary.BigEndian.Uint64(b[1:9]))).UTC()}
	copy(p.id.Bytes[:], b[9:])
	p.id.Valid = true
	return p, nil
}

// readKeys runs sql, a query of adminColumns, with args, in a transaction
// of its own on pool under the lock timeout, and reads its rows.
func (s *Store) readKeys(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) ([]keyRow, error) {
	return readAll(ctx, s, pool, scanKeyInfo, sql, args...)
}

// scanKeyInfo reads a row of adminColumns, with the decoders of the
// lease's steps and of the request kept for a finisher. A row they cannot read
// is store.ErrCorrupt; the error names the key, never what was kept.
func scanKeyInfo(row pgx.Row) (keyRow, error) {
	var (
		r           keyRow
		state       string
		lockedUntil *time.Time
		status      string
		rcode       *int32
		body        []byte
		notCached   bool
		stepNames   []*string
		stepResults [][]byte
		method      *string
		payload     []byte
		mdNames     []*string
		mdValues    [][]byte
		lastReplay  *time.Time
	)
	err := row.Scan(&r.pos.id, &r.Scope.Tenant, &r.Scope.Method, &r.Scope.Key, &state, &r.Fingerprint,
		&r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &lockedUntil, &r.Takeovers,
		&status, &rcode, &body, &notCached,
		&stepNames, &stepResults,
		&method, &payload, &mdNames, &mdValues,
		&r.Replays, &lastReplay)
	if err != nil {
		return keyRow{}, err
	}
	if lastReplay != nil {
		r.LastReplay = *lastReplay
	}
	r.pos.at = r.CreatedAt
	r.State = store.State(state)
	switch status {
	case "recorded":
		out := store.Outcome{Body: body, NotCached: notCached}
		if rcode != nil {
			out.Code = code.Code(*rcode)
		}
		r.Outcome = &out
	case "in_progress":
		if lockedUntil != nil {
			r.LeaseUntil = *lockedUntil
		}
	default:
		return keyRow{}, fmt.Errorf("postgres: idempotency key has unknown status %q", status)
	}
	corrupt := func(err error) error {
		return fmt.Errorf("%w: key %q of tenant %q, method %q: %w", store.ErrCorrupt, r.Scope.Key, r.Scope.Tenant, r.Scope.Method, err)
	}
	if r.Steps, err = readSteps(stepNames, stepResults); err != nil {
		return keyRow{}, corrupt(err)
	}
	if len(r.Steps) == 0 {
		r.Steps = nil
	}
	if method != nil || payload != nil {
		c := &store.Call{Request: payload}
		if err := readKept(c, method, mdNames, mdValues); err != nil {
			return keyRow{}, corrupt(err)
		}
		r.Call = c
	}
	return r, nil
}

// Forget implements [store.Admin]. The DELETE decides alone, in a
// transaction of its own under the lock timeout (behind a row that another
// session holds locked it gives up with [store.ErrInUse]), on the tenant's
// shard: a lease that is live when the DELETE meets the row, taken a
// moment before included, is refused unless forced. When it deletes
// nothing, a read in the same round trip tells why. A forced Forget
// fences the lease's holder: its later writes match no row, or the row of
// a later claim with a token of its own, and fail with
// [store.ErrLeaseLost].
func (s *Store) Forget(ctx context.Context, k store.Scope, o store.ForgetOptions) error {
	if err := k.Validate(); err != nil {
		return err
	}
	audit, err := auditOf(o.Audit, k, store.ActionForget, o.Force)
	if err != nil {
		return err
	}
	return s.adminWrite(ctx, k, adminForget, o.Force, false, audit)
}

// Settle implements [store.Admin], as Forget does, with one UPDATE that
// records the outcome of st ([store.SettleOutcome]) as a lease's record
// would, and more: it clears the fencing token, so that the holder of a
// lease it forced is fenced (its later writes fail with
// [store.ErrLeaseLost]), and the steps, which no claim of a recorded key
// reads. An expired entry counts as none: Settle fails with
// [store.ErrNotFound]. A status that SettleOutcome refuses fails with its
// error before any statement, as an invalid scope does.
func (s *Store) Settle(ctx context.Context, k store.Scope, st *spb.Status, o store.SettleOptions) error {
	if err := k.Validate(); err != nil {
		return err
	}
	out, err := store.SettleOutcome(st)
	if err != nil {
		return err
	}
	audit, err := auditOf(o.Audit, k, store.ActionSettle, o.Force)
	if err != nil {
		return err
	}
	return s.adminWrite(ctx, k, adminSettle, o.Force, true, audit, int32(out.Code), out.Body, out.NotCached)
}

// adminWrite runs write, adminForget or adminSettle (settle) with the
// scope, force, the time and extra, and adminProbe behind it when it
// changed nothing, in one transaction under the lock timeout, one round
// trip. With audit, the key's row is locked first, and write runs as the
// audited statement that adds audit to idem_audit when it changes the
// row (see audited). A row whose lease ended between the two statements
// (its holder released or recorded it) is tried again.
func (s *Store) adminWrite(ctx context.Context, k store.Scope, write string, force, settle bool, audit *store.AuditEntry, extra ...any) error {
	if err := k.Validate(); err != nil {
		return err
	}
	pool, err := s.shardOf(k.Tenant)
	if err != nil {
		return err
	}
	sc := scopeOf(k)
	for range maxLeaseRounds {
		done, err := s.adminWriteOnce(ctx, pool, sc, k, write, force, settle, audit, extra)
		if done || err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: the key's row changed under %d attempts in a row", store.ErrInUse, maxLeaseRounds)
}

// adminWriteOnce runs one round of adminWrite; it reports false, without
// an error, when the round decided nothing.
func (s *Store) adminWriteOnce(ctx context.Context, pool *pgxpool.Pool, sc scope, k store.Scope, write string, force, settle bool, audit *store.AuditEntry, extra []any) (done bool, err error) {
	conn, err := s.acquire(ctx, pool)
	if err != nil {
		return false, err
	}
	defer func() { _ = abandon(ctx, conn) }() // rolls back what failed
	now := s.now()
	args := append([]any{sc.id, k.Tenant, k.Method, k.Key, force, now}, extra...)
	var qs []*pgx.QueuedQuery
	if audit != nil {
		qs = append(qs, &pgx.QueuedQuery{SQL: adminLock, Arguments: []any{sc.id, k.Tenant, k.Method, k.Key}})
		write = auditedWrites[write]
		args = append(args, s.retention(), audit.Operator, audit.Reason, audit.RequestID, audit.Peer)
	}
	qs = append(qs,
		&pgx.QueuedQuery{SQL: write, Arguments: args},
		&pgx.QueuedQuery{SQL: adminProbe, Arguments: []any{sc.id, k.Tenant, k.Method, k.Key, now}},
		&pgx.QueuedQuery{SQL: "COMMIT"})
	br, _, err := s.sendBounded(ctx, conn.Conn(), s.modeOf(pool), true, qs)
	if err != nil {
		return false, pgerr.Interpret(err)
	}
	defer func() {
		if cerr := br.Close(); err == nil {
			err = pgerr.Interpret(cerr)
		}
	}()
	if audit != nil {
		if _, err := br.Exec(); err != nil { // adminLock
			return false, pgerr.Interpret(err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return false, pgerr.Interpret(err)
	}
	var (
		status      string
		expired     bool
		lockedUntil *time.Time
		live        bool
		found       = true
	)
	if err := br.QueryRow().Scan(&status, &expired, &lockedUntil, &live); errors.Is(err, pgx.ErrNoRows) {
		found = false
	} else if err != nil {
		return false, pgerr.Interpret(err)
	}
	commit, err := br.Exec()
	if err != nil {
		return false, pgerr.Interpret(err)
	}
	if commit.String() != "COMMIT" {
		return false, errors.New("postgres: the key's change was rolled back")
	}
	switch {
	case tag.RowsAffected() > 0:
		return true, nil
	case !found:
		return true, store.ErrNotFound
	case expired && settle:
		return true, fmt.Errorf("%w: the key's entry expired", store.ErrNotFound)
	case settle && status == "recorded":
		return true, store.ErrNotInProgress
	case live && !force:
		return true, &store.LeaseLiveError{Until: *lockedUntil}
	}
	// The row changed between the write and the read (its lease ended,
	// say): look again.
	return false, nil
}
