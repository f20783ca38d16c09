package postgres_test

import (
	"bytes"
	"errors"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/migrations"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// TestScopeIDMatchesMigration checks that the id the store gives a key's row
// is the one migration 0004 computes in SQL for rows that existed before
// it, and that pgtest.KeyIDSQL gives tests.
func TestScopeIDMatchesMigration(t *testing.T) {
	pool := pgtest.NewPool(t)
	for _, k := range []store.Scope{
		{Tenant: "", Method: "/svc/M", Key: "k"},
		{Tenant: "acme", Method: "/payments.v1.PaymentService/CreatePayment", Key: "order-1"},
		{Tenant: "Zürich-ümlaut-日本", Method: "/a.b/C", Key: "x"},
		{Tenant: "a", Method: "b:c", Key: "k"}, // must differ from the next
		{Tenant: "a:b", Method: "c", Key: "k"},
		{Tenant: strings.Repeat("t", 255), Method: strings.Repeat("m", 1024), Key: strings.Repeat("k", 255)},
	} {
		var got [16]byte
		err := pool.QueryRow(ctx, `SELECT `+pgtest.KeyIDSQL("$1::text", "$2::text", "$3::text"), k.Tenant, k.Method, k.Key).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if want := postgres.ScopeID(k); got != want {
			t.Errorf("id of %q/%q/%q: SQL %x, Go %x", k.Tenant, k.Method, k.Key[:min(len(k.Key), 10)], got, want)
		}
	}
	if postgres.ScopeID(store.Scope{Tenant: "a", Method: "b:c", Key: "k"}) == postgres.ScopeID(store.Scope{Tenant: "a:b", Method: "c", Key: "k"}) {
		t.Error("two scopes that differ only in where a field ends share an id")
	}
}

// TestSnapshotIsolationFallsBackOnThePrimaryKey runs claims on a pool whose
// transactions are REPEATABLE READ or SERIALIZABLE: a claim that waited for
// the key's lock reads with a snapshot taken before it waited, so it cannot
// see the row the lock's holder committed and runs the handler too. The
// primary key must then refuse its record: its writes roll back, the
// caller gets an error it may retry (store.ErrConflict), and the retry
// replays the first outcome. One effect, never two.
func TestSnapshotIsolationFallsBackOnThePrimaryKey(t *testing.T) {
	for _, iso := range []string{"repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if _, err := pool.Exec(ctx, `CREATE TABLE w (v text)`); err != nil {
				t.Fatal(err)
			}
			s := postgres.New(pool, postgres.WithLockTimeout(10*time.Second))
			write := func(c store.Claim, v string) {
				t.Helper()
				tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
				if _, err := tx.Exec(ctx, `INSERT INTO w VALUES ($1)`, v); err != nil {
					t.Fatal(err)
				}
			}

			first, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
			if err != nil || first.Txn == nil {
				t.Fatalf("first claim: %+v, %v", first, err)
			}
			var (
				wg     sync.WaitGroup
				second store.Claim
				err2   error
			)
			wg.Go(func() { second, err2 = s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")}) })
			waitForAdvisoryLockWaiter(t, pool)
			write(first, "first")
			if err := first.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("first")}); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if err2 != nil || second.Txn == nil {
				t.Fatalf("second claim: %+v, %v; want a Txn, as its snapshot predates the first's commit", second, err2)
			}
			write(second, "second")
			err = second.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("second")})
			if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("second record: %v, want store.ErrConflict", err)
			}
			var writes, keys int
			if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM idempotency_keys)`).Scan(&writes, &keys); err != nil {
				t.Fatal(err)
			}
			if writes != 1 || keys != 1 {
				t.Fatalf("%d writes and %d keys, want 1 and 1", writes, keys)
			}
			retry, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
			if err != nil || retry.Entry == nil || string(retry.Entry.Outcome.Body) != "first" {
				t.Fatalf("retry: %+v, %v; want the first outcome replayed", retry, err)
			}
		})
	}
}

// waitForAdvisoryLockWaiter waits until a session of pool waits for an
// advisory lock.
func waitForAdvisoryLockWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no claim came to wait for the key's lock")
}

// migrateDownTo takes pool's database back to the schema of migration
// version, by the down migrations of every later one, newest first (which
// must undo them), and forgets that they were applied. It returns the exec
// of the tests that write rows as that schema held them.
func migrateDownTo(t *testing.T, pool *pgxpool.Pool, version int) (exec func(sql string, args ...any)) {
	t.Helper()
	exec = func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	downs, err := fs.Glob(migrations.FS, "*.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(downs)
	slices.Reverse(downs)
	for _, name := range downs {
		v, err := strconv.Atoi(name[:4])
		if err != nil {
			t.Fatalf("migration %s: %v", name, err)
		}
		if v <= version {
			break
		}
		sql, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		exec(string(sql))
		exec(`DELETE FROM idem_schema_migrations WHERE version = $1`, v)
	}
	return exec
}

// TestMigration0004 takes an installation of the schema before migration
// 0004 (built by the down migrations, which must undo it and every later
// one), with completed, expired and leased rows, through Migrate: the rows
// keep their meaning under the new primary key. A completed key replays,
// an expired one runs again, a lease that ran out is taken over with the
// step it saved.
func TestMigration0004(t *testing.T) {
	pool := pgtest.NewPool(t)
	exec := migrateDownTo(t, pool, 3)
	var pk string
	if err := pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'idempotency_keys_pkey'`).Scan(&pk); err != nil {
		t.Fatal(err)
	}
	if pk != "PRIMARY KEY (tenant, method, key)" {
		t.Fatalf("after the down migration the primary key is %s", pk)
	}

	// Rows as the earlier schema held them.
	exec(`INSERT INTO idempotency_keys (tenant, method, key, request_hash, status, response_code, response, expires_at)
VALUES ('acme', '/svc/M', 'done', 'fp', 'completed', 0, 'recorded', now() + interval '1 hour'),
       ('acme', '/svc/M', 'old', 'fp', 'completed', 0, 'stale', now() - interval '1 second')`)
	exec(`INSERT INTO idempotency_keys (tenant, method, key, request_hash, expires_at, locked_until, fencing_token, recovery_point, recovery_data)
VALUES ('acme', '/svc/M', 'leased', 'fp', now() + interval '1 hour', now() - interval '1 second', 7, 'charge_sent', 'ch_1')`)

	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'idempotency_keys_pkey'`).Scan(&pk); err != nil {
		t.Fatal(err)
	}
	if pk != "PRIMARY KEY (id)" {
		t.Fatalf("after migrating the primary key is %s", pk)
	}

	s := postgres.New(pool)
	k := func(name string) store.Scope { return store.Scope{Tenant: "acme", Method: "/svc/M", Key: name} }
	done, err := s.Claim(ctx, k("done"), store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || done.Entry == nil || string(done.Entry.Outcome.Body) != "recorded" {
		t.Fatalf("completed key after the migration: %+v, %v; want its replay", done, err)
	}
	old, err := s.Claim(ctx, k("old"), store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || old.Txn == nil {
		t.Fatalf("expired key after the migration: %+v, %v; want to own it", old, err)
	}
	if err := old.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("new")}); err != nil {
		t.Fatal(err)
	}
	leased, err := s.ClaimLeased(ctx, k("leased"), store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || leased.Lease == nil {
		t.Fatalf("abandoned lease after the migration: %+v, %v; want a takeover", leased, err)
	}
	if steps := leased.Lease.Steps(); len(steps) != 1 || steps[0].Name != "charge_sent" || string(steps[0].Result) != "ch_1" {
		t.Fatalf("steps after the takeover: %+v; want the one step the earlier schema held", steps)
	}
	if err := leased.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("leased")}); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded'`).Scan(&rows); err != nil || rows != 3 {
		t.Fatalf("%d recorded rows (%v), want 3", rows, err)
	}
}

// TestCheckAndClaimWithoutSchema covers a server whose database lacks idem's
// schema, or has an outdated one: Check says so at start-up, and a claim
// fails with store.ErrNotReady, not with an error a client would retry.
func TestCheckAndClaimWithoutSchema(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check of a migrated database: %v", err)
	}

	down, err := fs.ReadFile(migrations.FS, "0004_narrow_key_index.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, string(down)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM idem_schema_migrations WHERE version = 4`); err != nil {
		t.Fatal(err)
	}
	err = s.Check(ctx)
	if !errors.Is(err, store.ErrNotReady) || !strings.Contains(err.Error(), "0004_narrow_key_index") || !strings.Contains(err.Error(), "postgres.Migrate") {
		t.Fatalf("Check of an outdated schema: %v; want ErrNotReady naming the migration and postgres.Migrate", err)
	}
	if _, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")}); !errors.Is(err, store.ErrNotReady) {
		t.Fatalf("claim on an outdated schema: %v, want ErrNotReady", err)
	}

	if _, err := pool.Exec(ctx, `DROP TABLE idempotency_keys, idem_schema_migrations`); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, store.ErrNotReady) {
		t.Fatalf("Check without idem's tables: %v, want ErrNotReady", err)
	}
	if _, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")}); !errors.Is(err, store.ErrNotReady) {
		t.Fatalf("claim without idem's tables: %v, want ErrNotReady", err)
	}
	if _, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute}); !errors.Is(err, store.ErrNotReady) {
		t.Fatalf("lease without idem's tables: %v, want ErrNotReady", err)
	}
	// Once migrated, the same store serves.
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after Migrate: %v", err)
	}
	claimAndRecord(t, s, key)
}

// TestMigration0007 takes an installation of the schema before migration
// 0007 (built by the down migrations) with rows as the previous version
// wrote them: a leased call's steps in recovery_steps, a call saved before
// steps were kept with its last step alone (recovery_point), and a call
// kept for a finisher with its metadata in request_metadata. After Migrate
// each reads as before: the same steps, the same metadata; the lone step
// is the call's one step, in the arrays.
func TestMigration0007(t *testing.T) {
	pool := pgtest.NewPool(t)
	exec := migrateDownTo(t, pool, 6)

	// The previous version's encoding: entries (field 1) of a name (1)
	// and a value (2). Steps reserve=r1, charge=ch_1, empty=""; metadata
	// x-multi=a, x-multi=b, x-user=u-7.
	const (
		oldSteps    = `\x0a0d0a0772657365727665120272310a0e0a06636861726765120463685f310a090a05656d7074791200`
		oldMetadata = `\x0a0c0a07782d6d756c74691201610a0c0a07782d6d756c74691201620a0d0a06782d757365721203752d37`
	)
	id := pgtest.KeyIDSQL("'acme'", "'/svc/M'", "$1::text")
	leased := `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, expires_at, locked_until, fencing_token,
    recovery_point, recovery_data, recovery_steps, request_method, request_payload, request_metadata)
VALUES (` + id + `, 'acme', '/svc/M', $1, 'fp', now() + interval '1 hour', now() - interval '1 hour', 7, $2, $3, $4, $5, $6, $7)`
	exec(leased, "steps", "empty", []byte{}, oldSteps, nil, nil, nil)
	exec(leased, "point", "charge_sent", []byte("ch_42"), nil, nil, nil, nil)
	exec(leased, "kept", nil, nil, nil, "/svc/Charge", []byte("request"), oldMetadata)

	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var names, results string
	if err := pool.QueryRow(ctx, `SELECT step_names::text, step_results::text FROM idempotency_keys WHERE key = 'point'`).Scan(&names, &results); err != nil {
		t.Fatal(err)
	}
	if names != `{charge_sent}` || results != `{"\\x63685f3432"}` {
		t.Fatalf("the lone step moved to step_names %s, step_results %s; want {charge_sent} and ch_42", names, results)
	}

	s := postgres.New(pool)
	k := func(name string) store.Scope { return store.Scope{Tenant: "acme", Method: "/svc/M", Key: name} }
	for _, tc := range []struct {
		key   string
		steps []store.Step
	}{
		{"steps", []store.Step{{Name: "reserve", Result: []byte("r1")}, {Name: "charge", Result: []byte("ch_1")}, {Name: "empty"}}},
		{"point", []store.Step{{Name: "charge_sent", Result: []byte("ch_42")}}},
	} {
		lc, err := s.ClaimLeased(ctx, k(tc.key), store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
		if err != nil || lc.Lease == nil || !lc.TookOver {
			t.Fatalf("%s: takeover after the migration: %+v, %v", tc.key, lc, err)
		}
		if got := lc.Lease.Steps(); !sameSteps(got, tc.steps) {
			t.Errorf("%s: steps after the migration %v, want %v", tc.key, got, tc.steps)
		}
	}

	list, err := s.Abandoned(ctx, 0, 10)
	if err != nil || len(list) != 1 {
		t.Fatalf("Abandoned after the migration: %+v, %v; want the kept call", list, err)
	}
	want := map[string][]string{"x-multi": {"a", "b"}, "x-user": {"u-7"}}
	if a := list[0]; a.Unreadable != nil || a.Scope != k("kept") || a.Call.Method != "/svc/Charge" ||
		string(a.Call.Request) != "request" || !maps.EqualFunc(a.Call.Metadata, want, slices.Equal) {
		t.Fatalf("the kept call after the migration: %+v, want its method, request and metadata %v", a, want)
	}
}

// sameSteps reports whether a and b hold the same steps in the same order.
func sameSteps(a, b []store.Step) bool {
	return slices.EqualFunc(a, b, func(p, q store.Step) bool {
		return p.Name == q.Name && bytes.Equal(p.Result, q.Result)
	})
}

// TestMigration0008 takes an installation of the schema before migration
// 0008 (built by its down migration) with rows as servers of earlier
// versions could still write them there: a leased call's steps only in
// recovery_steps (the arrays empty, or stale), a step only in
// recovery_point, a kept call's metadata only in request_metadata, lists
// that do not decode, rows as the previous version wrote them, and
// recorded keys, 'completed'. After Migrate every row reads through the
// store as it did before, from the arrays and with the status 'recorded';
// the old columns are gone, and the table takes 'recorded' and no longer
// 'completed'.
func TestMigration0008(t *testing.T) {
	pool := pgtest.NewPool(t)
	exec := migrateDownTo(t, pool, 7)

	// Entries (field 1) of a name (1) and a value (2): steps reserve=r1,
	// charge=ch_1, empty=""; metadata x-user=u-7, x-multi=a, x-multi=b
	// (not sorted by name).
	const (
		oldSteps    = `\x0a0d0a0772657365727665120272310a0e0a06636861726765120463685f310a090a05656d7074791200`
		oldMetadata = `\x0a0d0a06782d757365721203752d370a0c0a07782d6d756c74691201610a0c0a07782d6d756c7469120162`
		// An entry whose value runs past the list.
		damaged = `\x0a0c0a07782d6d756c7469120561`
	)
	id := pgtest.KeyIDSQL("'acme'", "'/svc/M'", "$1::text")
	leased := `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, expires_at, locked_until, fencing_token,
    recovery_point, recovery_data, recovery_steps, step_names, step_results, request_method, request_payload, request_metadata,
    request_header_names, request_header_values)
VALUES (` + id + `, 'acme', '/svc/M', $1, 'fp', now() + interval '1 hour', now() - interval '1 hour', 7,
    $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
	none := []string(nil)
	exec(leased, "old-steps", "empty", []byte{}, oldSteps, none, nil, nil, nil, nil, none, nil)
	exec(leased, "stale-arrays", "empty", []byte{}, oldSteps, []string{"stale"}, [][]byte{[]byte("x")}, nil, nil, nil, none, nil)
	exec(leased, "point", "charge_sent", []byte("ch_42"), nil, none, nil, nil, nil, nil, none, nil)
	exec(leased, "old-metadata", nil, nil, nil, none, nil, "/svc/Charge", []byte("request"), oldMetadata, none, nil)
	exec(leased, "arrays", "charge", []byte("ch_1"), nil, []string{"reserve", "charge"}, [][]byte{[]byte("r1"), []byte("ch_1")},
		"/svc/Charge", []byte("request"), nil, []string{"x-user"}, [][]byte{[]byte("u-9")})
	exec(leased, "damaged-steps", nil, nil, damaged, none, nil, nil, nil, nil, none, nil)
	exec(leased, "damaged-metadata", nil, nil, nil, none, nil, "/svc/Charge", []byte("request"), damaged, none, nil)
	exec(`INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, response, expires_at, step_names, step_results)
VALUES (`+id+`, 'acme', '/svc/M', $1, 'fp', 'completed', 0, 'done', now() + interval '1 hour', '{reserve}', '{r1}')`, "recorded")

	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var statuses string
	if err := pool.QueryRow(ctx, `SELECT string_agg(DISTINCT status, ',' ORDER BY status) FROM idempotency_keys`).Scan(&statuses); err != nil || statuses != "in_progress,recorded" {
		t.Fatalf("statuses after the migration: %q, %v; want in_progress,recorded", statuses, err)
	}
	var old int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency_keys'::regclass AND NOT attisdropped
    AND attname IN ('recovery_point', 'recovery_data', 'recovery_steps', 'request_metadata')`).Scan(&old); err != nil || old != 0 {
		t.Fatalf("%d of the old columns are left (%v), want none", old, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET status = 'completed' WHERE key = 'recorded'`); pgCode(err) != "23514" {
		t.Fatalf("a status 'completed' after the migration: %v; want the CHECK constraint's check_violation", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET response_code = NULL WHERE key = 'recorded'`); pgCode(err) != "23514" {
		t.Fatalf("a recorded row without a code after the migration: %v; want the CHECK constraint's check_violation", err)
	}

	s := postgres.New(pool)
	k := func(name string) store.Scope { return store.Scope{Tenant: "acme", Method: "/svc/M", Key: name} }
	c, err := s.Claim(ctx, k("recorded"), store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Entry == nil || c.Entry.State != store.Recorded || string(c.Entry.Outcome.Body) != "done" {
		t.Fatalf("the recorded key after the migration: %+v, %v; want its replay", c, err)
	}
	ki, err := s.Key(ctx, k("recorded"))
	if err != nil || ki.State != store.Recorded || ki.Outcome == nil || !sameSteps(ki.Steps, []store.Step{{Name: "reserve", Result: []byte("r1")}}) {
		t.Fatalf("Key of the recorded key after the migration: %+v, %v", ki, err)
	}

	list, err := s.Abandoned(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]store.AbandonedCall{}
	for _, a := range list {
		kept[a.Scope.Key] = a
	}
	if len(kept) != 3 {
		t.Errorf("Abandoned after the migration lists %v, want the three kept calls", slices.Collect(maps.Keys(kept)))
	}
	for key, want := range map[string]map[string][]string{
		"old-metadata": {"x-multi": {"a", "b"}, "x-user": {"u-7"}},
		"arrays":       {"x-user": {"u-9"}},
	} {
		if a := kept[key]; a.Unreadable != nil || a.Call.Method != "/svc/Charge" || string(a.Call.Request) != "request" ||
			!maps.EqualFunc(a.Call.Metadata, want, slices.Equal) {
			t.Errorf("the kept call %s after the migration: %+v, want its metadata %v", key, a, want)
		}
	}
	if a := kept["damaged-metadata"]; a.Unreadable == nil {
		t.Errorf("the kept call whose metadata did not decode, after the migration: %+v; want it unreadable", a)
	}
	var headerNames []string
	if err := pool.QueryRow(ctx, `SELECT request_header_names FROM idempotency_keys WHERE key = 'old-metadata'`).Scan(&headerNames); err != nil ||
		!slices.Equal(headerNames, []string{"x-multi", "x-multi", "x-user"}) {
		t.Errorf("request_header_names of the moved metadata: %q, %v; want them sorted by name, as the store writes them", headerNames, err)
	}

	for _, tc := range []struct {
		key   string
		steps []store.Step
	}{
		{"old-steps", []store.Step{{Name: "reserve", Result: []byte("r1")}, {Name: "charge", Result: []byte("ch_1")}, {Name: "empty"}}},
		{"stale-arrays", []store.Step{{Name: "reserve", Result: []byte("r1")}, {Name: "charge", Result: []byte("ch_1")}, {Name: "empty"}}},
		{"point", []store.Step{{Name: "charge_sent", Result: []byte("ch_42")}}},
		{"arrays", []store.Step{{Name: "reserve", Result: []byte("r1")}, {Name: "charge", Result: []byte("ch_1")}}},
		{"old-metadata", nil},
	} {
		lc, err := s.ClaimLeased(ctx, k(tc.key), store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
		if err != nil || lc.Lease == nil || !lc.TookOver {
			t.Fatalf("%s: takeover after the migration: %+v, %v", tc.key, lc, err)
		}
		if got := lc.Lease.Steps(); !sameSteps(got, tc.steps) {
			t.Errorf("%s: steps after the migration %v, want %v", tc.key, got, tc.steps)
		}
		if err := lc.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte(tc.key)}); err != nil {
			t.Fatalf("%s: record after the migration: %v", tc.key, err)
		}
	}
	if _, err := s.ClaimLeased(ctx, k("damaged-steps"), store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute}); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("the key whose steps did not decode, after the migration: %v; want store.ErrCorrupt", err)
	}
	var recorded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded'`).Scan(&recorded); err != nil || recorded != 6 {
		t.Errorf("%d recorded rows (%v), want the recorded key and the five taken over", recorded, err)
	}
}

// pgCode returns the SQLSTATE of err, or "" if it is none of PostgreSQL's.
func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestRenamedMigrationRunsOnce: migration 0005 was once named
// 0005_steps_and_completion. A database that applied it under that name
// does not apply it again under its new one (it would bring back
// recovery_steps and request_metadata, which 0008 dropped), and Check
// finds the schema complete.
func TestRenamedMigrationRunsOnce(t *testing.T) {
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `UPDATE idem_schema_migrations SET name = '0005_steps_and_completion.up.sql' WHERE version = 5`); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var name string
	var old int
	if err := pool.QueryRow(ctx, `SELECT name, (SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency_keys'::regclass
    AND NOT attisdropped AND attname IN ('recovery_steps', 'request_metadata'))
FROM idem_schema_migrations WHERE version = 5`).Scan(&name, &old); err != nil {
		t.Fatal(err)
	}
	if name != "0005_steps_and_completion.up.sql" || old != 0 {
		t.Fatalf("after Migrate, version 5 is recorded as %q and %d of its old columns are back; want it not applied again", name, old)
	}
	if err := postgres.New(pool).Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

// TestRecordOnASchemaBefore0008IsNotReady: a server of this version on a
// database that has not applied migration 0008, whose constraint refuses
// the status 'recorded', is told so as for any outdated schema: Check
// names the migration, and a record fails with store.ErrNotReady (which
// the engine answers INTERNAL, not UNAVAILABLE, which clients retry for
// ever), committing nothing. The columns of migration 0010, which a
// leased claim writes, are added back: the schema lacks 0008 alone.
func TestRecordOnASchemaBefore0008IsNotReady(t *testing.T) {
	pool := pgtest.NewPool(t)
	exec := migrateDownTo(t, pool, 7)
	up, err := fs.ReadFile(migrations.FS, "0010_replay_counts.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	exec(string(up))
	s := postgres.New(pool)
	if err := s.Check(ctx); !errors.Is(err, store.ErrNotReady) || !strings.Contains(err.Error(), "0008_recorded_status") {
		t.Fatalf("Check before 0008: %v; want ErrNotReady naming the migration", err)
	}
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim before 0008: %+v, %v", c, err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); !errors.Is(err, store.ErrNotReady) {
		t.Fatalf("record before 0008: %v; want ErrNotReady", err)
	}
	lc, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease before 0008: %+v, %v", lc, err)
	}
	if err := lc.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); !errors.Is(err, store.ErrNotReady) {
		t.Fatalf("lease record before 0008: %v; want ErrNotReady", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status <> 'in_progress'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows recorded (%v), want none", n, err)
	}
}

// TestMigration0009AfterIndexesBuiltConcurrently takes the schema back to
// migration 0008, builds migration 0009's indexes on idempotency_keys by
// hand with CREATE INDEX CONCURRENTLY, as the migration's comment tells
// operators of a large table to, and migrates: the migration finds them,
// builds no second copy, and the store's audit trail works.
func TestMigration0009AfterIndexesBuiltConcurrently(t *testing.T) {
	pool := pgtest.NewPool(t)
	exec := migrateDownTo(t, pool, 8)
	if n := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = 'idem_audit'`); n != 0 {
		t.Fatalf("after the down migration idem_audit exists")
	}
	exec(`CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_created_at_idx ON idempotency_keys (created_at, id)`)
	exec(`CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_in_progress_idx ON idempotency_keys (created_at, id) WHERE status = 'in_progress'`)
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_indexes WHERE tablename = 'idempotency_keys'
  AND indexdef LIKE '%(created_at, id)%'`); n != 2 {
		t.Errorf("idempotency_keys has %d indexes on (created_at, id), want the 2 built by hand", n)
	}
	s := postgres.New(pool)
	k := store.Scope{Tenant: "t", Method: "/m", Key: "k"}
	if err := s.AddAudit(ctx, store.AuditEntry{Scope: k, Action: store.ActionFinish, Before: store.Abandoned}); err != nil {
		t.Fatalf("AddAudit after the migration: %v", err)
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check after the migration: %v", err)
	}
}
