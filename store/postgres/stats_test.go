package postgres_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// explain returns the plan of sql with args, as PostgreSQL runs it with
// those values.
func explain(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	rows, err := pool.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatalf("EXPLAIN: %v", err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

// TestAdminQueriesUseTheirIndexes fills idempotency_keys with 100 000
// recorded keys and 50 in progress, and checks the plans of the admin
// queries that must stay cheap on a large table: a page of ListKeys walks
// idempotency_keys_created_at_idx in order (no sort of the table), and
// the counts of the stuck keys and the oldest of them read
// idempotency_keys_in_progress_idx, the rows in progress only. It logs
// how long the counts of every key take, which read the whole table.
func TestAdminQueriesUseTheirIndexes(t *testing.T) {
	pool := pgtest.NewPool(t)
	insertKeys(t, pool, "recorded-", 100_000, "1 hour")
	exec(t, pool, `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, expires_at, locked_until)
SELECT `+pgtest.KeyIDSQL("'tenant-1'", "'/svc/Lease'", "'leased-' || g")+`, 'tenant-1', '/svc/Lease', 'leased-' || g, '\x01', 'in_progress',
       now() + interval '1 hour', now() + (g - 25) * interval '1 minute'
FROM generate_series(1, 50) g`)
	exec(t, pool, `ANALYZE idempotency_keys`)

	var noID pgtype.UUID
	page := explain(t, pool, postgres.AdminKeysSQL, nil, false, "tenant-1", "", nil, nil, []string{}, nil, noID, 101)
	if !strings.Contains(page, "idempotency_keys_created_at_idx") || strings.Contains(page, "Sort") {
		t.Errorf("a page of ListKeys does not walk idempotency_keys_created_at_idx in order:\n%s", page)
	}
	stuck := explain(t, pool, postgres.StatsStuckSQL, nil, true, "", "", nil, nil, []string{"in_progress", "abandoned"})
	if !strings.Contains(stuck, "idempotency_keys_in_progress_idx") {
		t.Errorf("the counts of the stuck keys do not read idempotency_keys_in_progress_idx:\n%s", stuck)
	}
	for _, state := range []string{"in_progress", "abandoned"} {
		oldest := explain(t, pool, postgres.StatsOldestSQL, nil, true, "", "", nil, nil, state)
		if !strings.Contains(oldest, "idempotency_keys_in_progress_idx") {
			t.Errorf("the oldest %s key is not read through idempotency_keys_in_progress_idx:\n%s", state, oldest)
		}
	}
	t.Logf("the counts of every key:\n%s", explain(t, pool, postgres.StatsCountsSQL, nil, true, "", "", nil, nil, []string{}))

	s := postgres.New(pool)
	for _, f := range []store.KeyFilter{
		{AllTenants: true},
		{AllTenants: true, States: []store.State{store.InProgress, store.Abandoned}},
	} {
		start := time.Now()
		st, err := s.Stats(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, c := range st.Counts {
			n += c.Count
		}
		if want := map[bool]int64{true: 100_050, false: 50}[len(f.States) == 0]; n != want {
			t.Errorf("Stats(%+v) counted %d keys, want %d", f, n, want)
		}
		if st.OldestInProgress == nil || st.OldestAbandoned == nil {
			t.Errorf("Stats(%+v) found no oldest key in progress or abandoned: %+v", f, st)
		}
		t.Logf("Stats(%+v) over 100 050 keys: %v", f.States, time.Since(start))
	}
}

// TestAuditInEveryExecMode runs the audited writes, the audit trail's
// listing and the counts in each of pgx's ways of sending a query: the
// audited statements' parameters (an interval, text in a SELECT list, a
// NULL state) encode in each.
func TestAuditInEveryExecMode(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			s := postgres.New(newPool(t, dsn, mode))
			tenant := "t-" + mode.String()
			k := store.Scope{Tenant: tenant, Method: "/m", Key: "k"}
			audit := &store.AuditEntry{Operator: "op", Reason: "why", RequestID: "req", Peer: "127.0.0.1:1"}
			for range 2 {
				lc, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Hour})
				if err != nil || lc.Lease == nil {
					t.Fatalf("lease: %+v, %v", lc, err)
				}
				if err := s.Settle(ctx, k, &spb.Status{Code: int32(code.Code_FAILED_PRECONDITION)}, store.SettleOptions{Force: true, Audit: audit}); err != nil {
					t.Fatalf("Settle: %v", err)
				}
				if err := s.Forget(ctx, k, store.ForgetOptions{Audit: audit}); err != nil {
					t.Fatalf("Forget: %v", err)
				}
			}
			if err := s.AddAudit(ctx, store.AuditEntry{Scope: k, Action: store.ActionFinish, Before: store.Abandoned, After: store.Recorded}); err != nil {
				t.Fatalf("AddAudit: %v", err)
			}
			list, _, err := s.AuditLog(ctx, store.AuditFilter{Tenant: tenant, Method: k.Method, Key: k.Key})
			if err != nil || len(list) != 5 || list[0].Action != store.ActionSettle || list[0].Before != store.InProgress ||
				list[0].After != store.Recorded || list[1].After != "" || list[1].Reason != "why" || list[4].Action != store.ActionFinish {
				t.Fatalf("AuditLog: %+v, %v", list, err)
			}
			if _, err := s.Stats(ctx, store.KeyFilter{Tenant: tenant, States: []store.State{store.InProgress, store.Abandoned}}); err != nil {
				t.Fatalf("Stats: %v", err)
			}
		})
	}
}
