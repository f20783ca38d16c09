package postgres

import (
	"cmp"
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/store"
)

const (
	// statsWhere selects the rows of a filter, as adminKeys does, without
	// its page: all tenants' with $2, else tenant $3's; of method $4
	// unless it is empty; created in [$5, $6), each bound unless NULL.
	statsWhere = `
WHERE ($2::boolean OR k.tenant = $3)
  AND ($4::text = '' OR k.method = $4)
  AND ($5::timestamptz IS NULL OR k.created_at >= $5)
  AND ($6::timestamptz IS NULL OR k.created_at < $6)`

	// statsCounts counts the rows of statsWhere in one of the states $7
	// (any state when it is empty) by tenant, method and state by the time
	// $1. It reads every row the filter selects: a sequential scan of the
	// table, or of the rows created in a range through
	// idempotency_keys_created_at_idx.
	statsCounts = `SELECT k.tenant, k.method, st.state, count(*)
FROM idempotency_keys k
CROSS JOIN LATERAL (SELECT CASE
    WHEN k.expires_at <= coalesce($1::timestamptz, now()) THEN 'expired'
    WHEN k.status = 'recorded' THEN 'recorded'
    WHEN k.locked_until > coalesce($1::timestamptz, now()) THEN 'in_progress'
    ELSE 'abandoned' END AS state) st` + statsWhere + `
  AND (cardinality($7::text[]) = 0 OR st.state = ANY($7::text[]))`

	// statsInProgress restricts statsCounts to the rows in progress, which
	// the partial index idempotency_keys_in_progress_idx holds: a filter
	// of the states in progress and abandoned only reads those rows.
	statsInProgress = `
  AND k.status = 'in_progress'`

	statsGroup = `
GROUP BY k.tenant, k.method, st.state`

	// statsOldest reads the oldest row of statsWhere in progress, in the
	// state $7 (in_progress or abandoned), through the partial index
	// idempotency_keys_in_progress_idx, in the order of pages.
	statsOldest = adminColumns + statsWhere + `
  AND k.status = 'in_progress' AND st.state = $7
ORDER BY k.created_at, k.id
LIMIT 1`
)

// Stats implements [store.Admin]. On each shard the filter asks, it runs
// one query that counts the rows the filter selects and two that read the
// oldest row in progress and the oldest abandoned, each in a transaction
// of its own under the lock timeout. The counts read every row the filter
// selects, so on a table of millions of keys they take a sequential scan
// of it (PostgreSQL's parallel workers share it), unless the filter
// bounds the creation times, which idempotency_keys_created_at_idx serves,
// or selects only the states in progress and abandoned, which the partial
// index idempotency_keys_in_progress_idx serves (it holds the rows in
// progress only). The oldest rows come from that partial index alone.
func (s *Store) Stats(ctx context.Context, f store.KeyFilter) (store.KeyStats, error) {
	if err := f.Validate(); err != nil {
		return store.KeyStats{}, err
	}
	if f.AllTenants {
		f.Tenant = ""
	}
	states := make([]string, len(f.States))
	inProgressOnly := len(f.States) > 0
	for i, st := range f.States {
		states[i] = string(st)
		inProgressOnly = inProgressOnly && (st == store.InProgress || st == store.Abandoned)
	}
	counts := statsCounts
	if inProgressOnly {
		counts += statsInProgress
	}
	counts += statsGroup
	pools, err := s.poolsOf(f.AllTenants, f.Tenant)
	if err != nil {
		return store.KeyStats{}, err
	}
	base := []any{s.now(), f.AllTenants, f.Tenant, f.Method, timeOrNull(f.CreatedAfter), timeOrNull(f.CreatedBefore)}
	var st store.KeyStats
	st.Counts, err = onEachPool(ctx, s, pools, func(ctx context.Context, pool *pgxpool.Pool) ([]store.KeyCount, error) {
		return readAll(ctx, s, pool, scanCount, counts, append(base, states)...)
	})
	if err != nil {
		return store.KeyStats{}, err
	}
	slices.SortFunc(st.Counts, func(a, b store.KeyCount) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Method, b.Method), cmp.Compare(a.State, b.State))
	})
	for _, o := range []struct {
		state store.State
		to    **store.KeyInfo
	}{{store.InProgress, &st.OldestInProgress}, {store.Abandoned, &st.OldestAbandoned}} {
		if len(f.States) > 0 && !slices.Contains(f.States, o.state) {
			continue
		}
		rows, err := onEachPool(ctx, s, pools, func(ctx context.Context, pool *pgxpool.Pool) ([]keyRow, error) {
			return s.readKeys(ctx, pool, statsOldest, append(base, string(o.state))...)
		})
		if err != nil {
			return store.KeyStats{}, err
		}
		if len(rows) > 0 {
			oldest := slices.MinFunc(rows, func(a, b keyRow) int { return a.pos.compare(b.pos) })
			*o.to = &oldest.KeyInfo
		}
	}
	return st, nil
}

func scanCount(row pgx.Row) (store.KeyCount, error) {
	var (
		c     store.KeyCount
		state string
	)
	err := row.Scan(&c.Tenant, &c.Method, &state, &c.Count)
	c.State = store.State(state)
	return c, err
}
