package postgres_test

import (
	"errors"
	"hash/fnv"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/storetest"
)

// The tenants of the shard tests: alpha lives on shard 0, beta on shard 1,
// and nowhere on none.
const (
	alpha   = "alpha"
	beta    = "beta"
	nowhere = "nowhere"
)

func byName(tenant string) int {
	switch tenant {
	case alpha:
		return 0
	case beta:
		return 1
	}
	return -1
}

// twoShards returns two databases, each with idem's schema and a table
// orders for the handlers' writes, and a store sharded over them by
// byName.
func twoShards(t *testing.T, opts ...postgres.Option) (s *postgres.Store, a, b *pgxpool.Pool) {
	t.Helper()
	a, b = pgtest.NewPool(t), pgtest.NewPool(t)
	for _, p := range []*pgxpool.Pool{a, b} {
		exec(t, p, `CREATE TABLE orders (tenant text NOT NULL, key text NOT NULL, db text NOT NULL DEFAULT current_database())`)
	}
	return postgres.NewSharded([]*pgxpool.Pool{a, b}, byName, opts...), a, b
}

// keysOf counts the rows of idempotency_keys of tenant in pool.
func keysOf(t *testing.T, pool *pgxpool.Pool, tenant string) int64 {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1`, tenant)
}

// ordersOf counts the rows of orders of tenant in pool.
func ordersOf(t *testing.T, pool *pgxpool.Pool, tenant string) int64 {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM orders WHERE tenant = $1`, tenant)
}

// claimAndWrite claims k and, as a handler would, inserts an order through
// the claim's transaction, then completes with body. It returns the name of
// the database the transaction ran on.
func claimAndWrite(t *testing.T, s *postgres.Store, k store.Scope, body string) string {
	t.Helper()
	c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim %v: %+v, %v; want a Txn", k, c, err)
	}
	tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
	var db string
	if err := tx.QueryRow(ctx, `INSERT INTO orders (tenant, key) VALUES ($1, $2) RETURNING db`, k.Tenant, k.Key).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	return db
}

func currentDatabase(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	return db
}

func TestShardedClaimRunsOnTheTenantsShard(t *testing.T) {
	s, a, b := twoShards(t)
	ka := store.Scope{Tenant: alpha, Method: "/svc/M", Key: "k"}
	kb := store.Scope{Tenant: beta, Method: "/svc/M", Key: "k"} // the same key, another tenant

	if db := claimAndWrite(t, s, ka, "alpha's"); db != currentDatabase(t, a) {
		t.Fatalf("alpha's handler wrote on database %s, want shard 0's, %s", db, currentDatabase(t, a))
	}
	if keysOf(t, a, alpha) != 1 || ordersOf(t, a, alpha) != 1 {
		t.Fatalf("shard 0 holds %d keys and %d orders of alpha, want 1 and 1", keysOf(t, a, alpha), ordersOf(t, a, alpha))
	}
	if n := count(t, b, `SELECT count(*) FROM idempotency_keys`) + count(t, b, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("shard 1 holds %d rows after alpha's claim, want none", n)
	}

	// The same key under beta is beta's own, on shard 1.
	if db := claimAndWrite(t, s, kb, "beta's"); db != currentDatabase(t, b) {
		t.Fatalf("beta's handler wrote on database %s, want shard 1's, %s", db, currentDatabase(t, b))
	}
	for _, c := range []struct {
		pool          *pgxpool.Pool
		tenant        string
		keys, written int64
	}{{a, alpha, 1, 1}, {a, beta, 0, 0}, {b, beta, 1, 1}, {b, alpha, 0, 0}} {
		if k, o := keysOf(t, c.pool, c.tenant), ordersOf(t, c.pool, c.tenant); k != c.keys || o != c.written {
			t.Errorf("%s's rows on %s: %d keys and %d orders, want %d and %d", c.tenant, currentDatabase(t, c.pool), k, o, c.keys, c.written)
		}
	}

	// Replays come from the tenant's shard: change each stored response
	// in place, and each retry answers with its own shard's.
	exec(t, a, `UPDATE idempotency_keys SET response = 'from shard 0'`)
	exec(t, b, `UPDATE idempotency_keys SET response = 'from shard 1'`)
	for k, want := range map[store.Scope]string{ka: "from shard 0", kb: "from shard 1"} {
		c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
		if err != nil || c.Entry == nil || c.Entry.State != store.Recorded {
			t.Fatalf("retry of %v: %+v, %v; want the completed entry", k, c, err)
		}
		if got := string(c.Entry.Outcome.Body); got != want {
			t.Errorf("retry of %v replayed %q, want %q", k, got, want)
		}
	}
}

func TestShardedConcurrentDuplicatesExecuteOnce(t *testing.T) {
	s, a, b := twoShards(t, postgres.WithLockTimeout(10*time.Second))
	var (
		mu     sync.Mutex
		owners = map[string]int{}
		wg     sync.WaitGroup
		called sync.WaitGroup
	)
	called.Add(32)
	for i := range 32 {
		tenant := []string{alpha, beta}[i%2]
		wg.Go(func() {
			k := store.Scope{Tenant: tenant, Method: "/svc/M", Key: "dup"}
			called.Done()
			c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
			if err != nil {
				t.Error(err)
				return
			}
			if c.Txn == nil {
				return
			}
			mu.Lock()
			owners[tenant]++
			mu.Unlock()
			tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
			if _, err := tx.Exec(ctx, `INSERT INTO orders (tenant, key) VALUES ($1, $2)`, k.Tenant, k.Key); err != nil {
				t.Error(err)
			}
			called.Wait() // the others called Claim while the key is held
			if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if owners[alpha] != 1 || owners[beta] != 1 {
		t.Fatalf("owners by tenant: %v, want one each", owners)
	}
	if ordersOf(t, a, alpha) != 1 || ordersOf(t, b, beta) != 1 || ordersOf(t, a, beta) != 0 || ordersOf(t, b, alpha) != 0 {
		t.Fatalf("orders: alpha %d on shard 0, %d on shard 1; beta %d on shard 1, %d on shard 0; want 1, 0, 1, 0",
			ordersOf(t, a, alpha), ordersOf(t, b, alpha), ordersOf(t, b, beta), ordersOf(t, a, beta))
	}
}

func TestShardedLeaseWritesToItsShard(t *testing.T) {
	clock := newTestClock()
	s, a, b := twoShards(t, postgres.WithClock(clock.Now))
	k := store.Scope{Tenant: beta, Method: "/svc/Charge", Key: "k"}
	lc, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease: %+v, %v", lc, err)
	}
	l := lc.Lease
	if err := l.SaveStep(ctx, store.Step{Name: "charge_sent", Result: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM idempotency_keys
WHERE tenant = $1 AND step_names = '{charge_sent}' AND locked_until = $2`, beta, clock.Now().Add(time.Hour)); n != 1 {
		t.Fatalf("shard 1 holds %d rows of beta's lease with its step and extended lease, want 1", n)
	}
	if err := l.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("charged")}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND status = 'recorded' AND response = 'charged'`, beta); n != 1 {
		t.Fatalf("shard 1 holds %d recorded rows of beta's lease, want 1", n)
	}
	if n := count(t, a, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Fatalf("shard 0 holds %d rows, want none", n)
	}

	// Release, on the other shard: a claim with a saved step keeps it
	// and ends its lease; one without is deleted.
	ka := store.Scope{Tenant: alpha, Method: "/svc/Charge", Key: "k"}
	kept, err := s.ClaimLeased(ctx, ka, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Hour})
	if err != nil || kept.Lease == nil {
		t.Fatalf("lease: %+v, %v", kept, err)
	}
	if err := kept.Lease.SaveStep(ctx, store.Step{Name: "charge_sent"}); err != nil {
		t.Fatal(err)
	}
	if err := kept.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	gone := store.Scope{Tenant: alpha, Method: "/svc/Charge", Key: "gone"}
	released, err := s.ClaimLeased(ctx, gone, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Hour})
	if err != nil || released.Lease == nil {
		t.Fatalf("lease: %+v, %v", released, err)
	}
	if keysOf(t, a, alpha) != 2 {
		t.Fatalf("shard 0 holds %d keys of alpha before the releases, want 2", keysOf(t, a, alpha))
	}
	if err := released.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, a, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND key = 'k' AND locked_until <= $2`, alpha, clock.Now()); n != 1 || keysOf(t, a, alpha) != 1 {
		t.Fatalf("shard 0: %d released rows with a saved step, %d keys of alpha; want 1 and 1", n, keysOf(t, a, alpha))
	}
	if keysOf(t, b, alpha) != 0 {
		t.Fatalf("shard 1 holds %d keys of alpha, want none", keysOf(t, b, alpha))
	}

	// A takeover on the key's shard fences the earlier owner off there.
	short, err := s.ClaimLeased(ctx, store.Scope{Tenant: beta, Method: "/svc/Charge", Key: "short"}, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: 100 * time.Millisecond})
	if err != nil || short.Lease == nil {
		t.Fatalf("lease: %+v, %v", short, err)
	}
	clock.Add(200 * time.Millisecond)
	taker, err := s.ClaimLeased(ctx, store.Scope{Tenant: beta, Method: "/svc/Charge", Key: "short"}, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || !taker.TookOver {
		t.Fatalf("takeover: %+v, %v", taker, err)
	}
	if err := short.Lease.Extend(ctx, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Extend of the fenced lease: %v, want ErrLeaseLost", err)
	}
	if err := taker.Lease.Record(ctx, store.Outcome{Code: code.Code_OK}); err != nil {
		t.Fatal(err)
	}
}

var completion = &store.Call{Method: "/svc/Charge", Request: []byte("request")}

// abandonLease leases k, kept for completion, for a lease of a millisecond,
// and leaves it.
func abandonLease(t *testing.T, s *postgres.Store, k store.Scope) {
	t.Helper()
	lc, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Call: completion, Lease: time.Millisecond})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease %v: %+v, %v", k, lc, err)
	}
}

// releaseKept leases k, kept for completion, and releases it, as a call
// that failed transiently before any step does: the claim stays, its
// lease ended, so Abandoned lists it at once.
func releaseKept(t *testing.T, s *postgres.Store, k store.Scope) {
	t.Helper()
	lc, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Call: completion, Lease: time.Hour})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease %v: %+v, %v", k, lc, err)
	}
	if err := lc.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestShardedAbandonedLooksAtEveryShard(t *testing.T) {
	clock := newTestClock()
	s, a, b := twoShards(t, postgres.WithClock(clock.Now))
	for _, k := range []store.Scope{
		{Tenant: alpha, Method: "/svc/Charge", Key: "a1"},
		{Tenant: alpha, Method: "/svc/Charge", Key: "a2"},
		{Tenant: alpha, Method: "/svc/Charge", Key: "a3"},
		{Tenant: beta, Method: "/svc/Charge", Key: "b1"},
	} {
		abandonLease(t, s, k)
	}
	clock.Add(20 * time.Millisecond)

	got, err := s.Abandoned(ctx, 0, 10)
	if err != nil || len(got) != 4 {
		t.Fatalf("Abandoned = %d calls, %v; want the 4 of both shards", len(got), err)
	}
	// Within a limit, each shard gets its turn.
	got, err = s.Abandoned(ctx, 0, 2)
	if err != nil || len(got) != 2 || got[0].Scope.Tenant == got[1].Scope.Tenant {
		t.Fatalf("Abandoned with limit 2 = %+v, %v; want one call of each shard", got, err)
	}

	// Finishing each as a finisher does (a takeover with the same
	// request) records it on its own shard.
	got, _ = s.Abandoned(ctx, 0, 10)
	for _, c := range got {
		lc, err := s.ClaimLeased(ctx, c.Scope, store.LeaseRequest{Fingerprint: c.Fingerprint, Call: &c.Call, Lease: time.Minute})
		if err != nil || !lc.TookOver {
			t.Fatalf("takeover of %v: %+v, %v", c.Scope, lc, err)
		}
		if err := lc.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte(c.Scope.Key)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, a, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND status = 'recorded' AND response = convert_to(key, 'UTF8') AND request_payload IS NULL`, alpha); n != 3 {
		t.Errorf("shard 0 holds %d of alpha's calls completed, want 3", n)
	}
	if n := count(t, b, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND status = 'recorded' AND response = convert_to(key, 'UTF8') AND request_payload IS NULL`, beta); n != 1 {
		t.Errorf("shard 1 holds %d of beta's calls completed, want 1", n)
	}
	if n := keysOf(t, a, beta) + keysOf(t, b, alpha); n != 0 {
		t.Errorf("%d keys on the other tenant's shard, want none", n)
	}
	if got, err := s.Abandoned(ctx, 0, 10); err != nil || len(got) != 0 {
		t.Errorf("Abandoned after completing = %+v, %v; want none", got, err)
	}
}

func TestShardedAbandonedSurvivesAFailedShard(t *testing.T) {
	a, b := pgtest.NewPool(t), pgtest.NewPool(t)
	down, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	down.Close() // every query of a closed pool fails
	route := func(tenant string) int { return byName(tenant) }
	clock := newTestClock()
	s := postgres.NewSharded([]*pgxpool.Pool{a, down, b}, route, postgres.WithClock(clock.Now))
	abandonLease(t, s, store.Scope{Tenant: alpha, Method: "/svc/Charge", Key: "a1"})
	clock.Add(20 * time.Millisecond)

	got, err := s.Abandoned(ctx, 0, 10)
	if len(got) != 1 || got[0].Scope.Tenant != alpha {
		t.Fatalf("Abandoned = %+v, want alpha's call of the shard that answered", got)
	}
	if err == nil || !containsAll(err.Error(), "shard 1") {
		t.Fatalf("Abandoned error = %v, want one that names shard 1", err)
	}
}

func TestShardedRouteWithoutShardIsAnError(t *testing.T) {
	a, b := pgtest.NewPool(t), pgtest.NewPool(t)
	k := store.Scope{Tenant: nowhere, Method: "/svc/M", Key: "k"}
	for name, s := range map[string]*postgres.Store{
		"negative":     postgres.NewSharded([]*pgxpool.Pool{a, b}, byName),
		"past the end": postgres.NewSharded([]*pgxpool.Pool{a, b}, func(string) int { return 2 }),
		"nil pool":     postgres.NewSharded([]*pgxpool.Pool{a, nil}, func(string) int { return 1 }),
		"nil route":    postgres.NewSharded([]*pgxpool.Pool{a, b}, nil),
		"no shards":    postgres.NewSharded(nil, func(string) int { return 0 }),
	} {
		t.Run(name, func(t *testing.T) {
			c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
			if !errors.Is(err, postgres.ErrNoShard) || c.Txn != nil || c.Entry != nil {
				t.Fatalf("Claim = %+v, %v; want ErrNoShard", c, err)
			}
			for _, sentinel := range []error{store.ErrInUse, store.ErrConflict, store.ErrLeaseLost, store.ErrNotReady, store.ErrInvalidScope} {
				if errors.Is(err, sentinel) {
					t.Errorf("Claim's error %v is %v, want none of store's sentinels", err, sentinel)
				}
			}
			lc, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
			if !errors.Is(err, postgres.ErrNoShard) || lc.Lease != nil || lc.Entry != nil {
				t.Fatalf("Lease = %+v, %v; want ErrNoShard", lc, err)
			}
			// A key no store can hold is refused as such, before the route.
			if _, err := s.Claim(ctx, store.Scope{Tenant: nowhere, Method: "/svc/M"}, store.ClaimRequest{}); !errors.Is(err, store.ErrInvalidScope) {
				t.Errorf("Claim of an invalid key: %v, want ErrInvalidScope", err)
			}
		})
	}
	if n := count(t, a, `SELECT count(*) FROM idempotency_keys`) + count(t, b, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Fatalf("%d keys written, want none", n)
	}
}

func TestShardedCheckNamesTheShardThatIsNotReady(t *testing.T) {
	a, b := pgtest.NewPool(t), pgtest.NewPool(t)
	s := postgres.NewSharded([]*pgxpool.Pool{a, b}, byName)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check of two migrated shards: %v", err)
	}
	exec(t, b, `DELETE FROM idem_schema_migrations WHERE version = 5`)
	err := s.Check(ctx)
	if !errors.Is(err, store.ErrNotReady) || !containsAll(err.Error(), "shard 1", "0005_") || containsAll(err.Error(), "shard 0") {
		t.Fatalf("Check with shard 1 behind: %v; want ErrNotReady naming shard 1 and its missing migration only", err)
	}
	if err := postgres.NewSharded(nil, byName).Check(ctx); !errors.Is(err, postgres.ErrNoShard) {
		t.Fatalf("Check of a store without shards: %v, want ErrNoShard", err)
	}
	// A store of one shard whose pool is nil says so, rather than panic.
	one := postgres.NewSharded([]*pgxpool.Pool{nil}, byName)
	if err := one.Check(ctx); !errors.Is(err, postgres.ErrNoShard) {
		t.Fatalf("Check of a store whose one pool is nil: %v, want ErrNoShard", err)
	}
	if got, err := one.Abandoned(ctx, 0, 10); err != nil || len(got) != 0 {
		t.Fatalf("Abandoned of a store whose one pool is nil: %+v, %v; want none", got, err)
	}
}

// TestShardedRoutePanicIsTheTenantsError: a route that panics for a
// tenant fails that tenant's claims and leases with ErrNoShard, quoting
// the panic, and touches nothing; other tenants, Abandoned and Check go
// on. Before, the panic went up through the store into whoever called it.
func TestShardedRoutePanicIsTheTenantsError(t *testing.T) {
	a, b := pgtest.NewPool(t), pgtest.NewPool(t)
	s := postgres.NewSharded([]*pgxpool.Pool{a, b}, func(tenant string) int {
		if tenant == "boom" {
			return []int{}[len(tenant)] // a bug: index out of range
		}
		return byName(tenant)
	})
	k := store.Scope{Tenant: "boom", Method: "/svc/M", Key: "k"}
	wantPanicError := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, postgres.ErrNoShard) || !containsAll(err.Error(), "route panicked", "index out of range") {
			t.Errorf("%s: %v; want ErrNoShard quoting the route's panic", what, err)
		}
		for _, sentinel := range []error{store.ErrInUse, store.ErrConflict, store.ErrLeaseLost, store.ErrNotReady, store.ErrInvalidScope} {
			if errors.Is(err, sentinel) {
				t.Errorf("%s: %v is %v, want none of store's sentinels", what, err, sentinel)
			}
		}
	}
	c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	wantPanicError("Claim", err)
	if c.Txn != nil || c.Entry != nil {
		t.Errorf("Claim = %+v, want nothing", c)
	}
	lc, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Call: completion, Lease: time.Minute})
	wantPanicError("Lease", err)
	if lc.Lease != nil || lc.Entry != nil {
		t.Errorf("Lease = %+v, want nothing", lc)
	}

	// The other tenants, the listing of abandoned calls and the schema
	// check do not call the route for boom, and go on.
	releaseKept(t, s, store.Scope{Tenant: alpha, Method: "/svc/Charge", Key: "a1"})
	if got, err := s.Abandoned(ctx, 0, 10); err != nil || len(got) != 1 || got[0].Scope.Tenant != alpha {
		t.Errorf("Abandoned = %+v, %v; want alpha's call", got, err)
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check: %v", err)
	}
	if n := count(t, a, `SELECT count(*) FROM idempotency_keys WHERE tenant = 'boom'`) + count(t, b, `SELECT count(*) FROM idempotency_keys WHERE tenant = 'boom'`); n != 0 {
		t.Errorf("%d keys of boom written, want none", n)
	}
}

// blackholePool returns a pool of a "database" that accepts connections
// and never answers, as a shard behind a broken network or a stuck proxy
// does, and the number of connections it has accepted so far.
func blackholePool(t *testing.T) (*pgxpool.Pool, func() int) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	pool, err := pgxpool.New(ctx, "postgres://root@"+lis.Addr().String()+"/blackhole?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // first: it ends the connection attempts
	return pool, func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
}

// within runs f and fails the test if it has not returned within d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// TestShardedBlackholedShardIsBoundedByTheLockTimeout: a shard that
// accepts connections and never answers holds up neither Abandoned,
// whose other shards' calls come back with an error naming it, nor a
// claim of one of its tenants: each waits at most the lock timeout for a
// connection. Before, Abandoned waited for the shard as long as its
// context lasted, for ever without a deadline.
func TestShardedBlackholedShardIsBoundedByTheLockTimeout(t *testing.T) {
	a := pgtest.NewPool(t)
	dark, accepted := blackholePool(t)
	s := postgres.NewSharded([]*pgxpool.Pool{a, dark}, byName, postgres.WithLockTimeout(500*time.Millisecond))
	releaseKept(t, s, store.Scope{Tenant: alpha, Method: "/svc/Charge", Key: "a1"})

	var (
		got []store.AbandonedCall
		err error
	)
	within(t, 30*time.Second, "Abandoned", func() { got, err = s.Abandoned(ctx, 0, 10) })
	if len(got) != 1 || got[0].Scope.Tenant != alpha {
		t.Errorf("Abandoned = %+v, want alpha's call", got)
	}
	if err == nil || !containsAll(err.Error(), "shard 1") {
		t.Errorf("Abandoned's error = %v, want one that names shard 1", err)
	}
	if accepted() == 0 {
		t.Errorf("Abandoned never reached shard 1")
	}

	within(t, 30*time.Second, "Claim", func() {
		_, err = s.Claim(ctx, store.Scope{Tenant: beta, Method: "/svc/M", Key: "k"}, store.ClaimRequest{Fingerprint: []byte("fp")})
	})
	if err == nil {
		t.Errorf("a claim on the blackholed shard succeeded")
	}
}

func TestShardedSweepersSweepTheirShards(t *testing.T) {
	_, a, b := twoShards(t)
	for _, p := range []*pgxpool.Pool{a, b} {
		insertKeys(t, p, "expired-", 30, "-1 hour")
		insertKeys(t, p, "live-", 5, "1 hour")
	}
	// One sweeper per shard, as a sharded deployment runs them.
	for i, p := range []*pgxpool.Pool{a, b} {
		n, err := postgres.NewSweeper(p).Sweep(ctx)
		if err != nil || n != 30 {
			t.Fatalf("sweeper of shard %d deleted %d rows, %v; want 30", i, n, err)
		}
		if left := count(t, p, `SELECT count(*) FROM idempotency_keys`); left != 5 {
			t.Fatalf("shard %d keeps %d keys, want the 5 live ones", i, left)
		}
	}
}

// shardByHash is the route of the conformance suite's sharded store: a hash
// of the tenant over two shards, which sends the suite's main tenant
// ("tenant") to shard 1 and "other-tenant" to shard 0 (see
// TestShardByHashSpreadsTheSuitesTenants).
func shardByHash(tenant string) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % 2)
}

func TestShardByHashSpreadsTheSuitesTenants(t *testing.T) {
	if shardByHash("tenant") != 1 || shardByHash("other-tenant") != 0 {
		t.Fatalf("shardByHash sends tenant to %d and other-tenant to %d; want 1 and 0, so that the suite runs on both shards",
			shardByHash("tenant"), shardByHash("other-tenant"))
	}
}

func TestShardedConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		shards := []*pgxpool.Pool{pgtest.NewPool(t), pgtest.NewPool(t)}
		return postgres.NewSharded(shards, shardByHash,
			postgres.WithTTL(cfg.TTL), postgres.WithLockTimeout(cfg.LockTimeout), postgres.WithClock(cfg.Now))
	})
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
