package interceptor_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// shardOf is the route of the sharded tests: tenant alpha on shard 0, beta
// on shard 1, any other on none.
func shardOf(tenant string) int {
	switch tenant {
	case "alpha":
		return 0
	case "beta":
		return 1
	}
	return -1
}

// twoShardDatabases returns two databases, each with idem's schema and the
// test service's table effects.
func twoShardDatabases(t *testing.T) []*pgxpool.Pool {
	t.Helper()
	shards := []*pgxpool.Pool{pgtest.NewPool(t), pgtest.NewPool(t)}
	for _, p := range shards {
		if _, err := p.Exec(context.Background(), `CREATE TABLE effects (id bigserial PRIMARY KEY, key text, value text)`); err != nil {
			t.Fatal(err)
		}
	}
	return shards
}

func countOn(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func forTenant(tenant, key string) context.Context {
	return metadata.AppendToOutgoingContext(withKey(key), "x-tenant-id", tenant)
}

func TestShardedStoreServesEachTenantFromItsShard(t *testing.T) {
	shards := twoShardDatabases(t)
	e := serveEnv(t, setup{}, nil, postgres.NewSharded(shards, shardOf))
	e.svc.pool = shards[0] // the handler writes through the claim's transaction

	for _, tenant := range []string{"alpha", "beta"} {
		first, err := e.client.Do(forTenant(tenant, "k"), &testv1.DoRequest{Value: tenant})
		if err != nil {
			t.Fatal(err)
		}
		var header metadata.MD
		again, err := e.client.Do(forTenant(tenant, "k"), &testv1.DoRequest{Value: tenant}, grpc.Header(&header))
		if err != nil || again.GetExecution() != first.GetExecution() || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Fatalf("%s's retry: %v, %v (header %v); want a replay of execution %d", tenant, again, err, header, first.GetExecution())
		}
	}
	for i, tenant := range []string{"alpha", "beta"} {
		mine, theirs := shards[i], shards[1-i]
		if n := countOn(t, mine, `SELECT count(*) FROM effects WHERE value = $1`, tenant); n != 1 {
			t.Errorf("shard %d holds %d effects of %s, want 1", i, n, tenant)
		}
		if n := countOn(t, mine, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND status = 'recorded'`, tenant); n != 1 {
			t.Errorf("shard %d holds %d completed keys of %s, want 1", i, n, tenant)
		}
		if n := countOn(t, theirs, `SELECT count(*) FROM effects WHERE value = $1`, tenant) +
			countOn(t, theirs, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1`, tenant); n != 0 {
			t.Errorf("shard %d holds %d rows of %s, want none", 1-i, n, tenant)
		}
	}

	// A tenant without a shard: UNAVAILABLE with a retry delay, the reason
	// in the server's log only, and nothing written.
	_, err := e.client.Do(forTenant("nowhere", "k"), &testv1.DoRequest{Value: "nowhere"})
	st := wantCode(t, err, codes.Unavailable)
	hasRetry := false
	for _, d := range st.Details() {
		_, ok := d.(*errdetails.RetryInfo)
		hasRetry = hasRetry || ok
	}
	if !hasRetry {
		t.Errorf("UNAVAILABLE for a tenant without a shard has no RetryInfo: %v", st.Details())
	}
	if strings.Contains(st.Message(), "shard") {
		t.Errorf("the client was told of the store's shards: %q", st.Message())
	}
	if log := e.log.String(); !strings.Contains(log, postgres.ErrNoShard.Error()) {
		t.Errorf("the server's log does not say the tenant has no shard:\n%s", log)
	}
	if n := e.svc.count(); n != 2 {
		t.Errorf("the handler ran %d times, want 2 (once per tenant)", n)
	}
}

func TestFinisherFinishesAbandonedCallsOnEveryShard(t *testing.T) {
	shards := twoShardDatabases(t)
	st := postgres.NewSharded(shards, shardOf)
	opts := []idem.Option{
		idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute, Finish: true}),
		idem.WithTenant(idemtest.TenantFromHeader),
	}
	e := serveEnv(t, setup{opts: opts}, nil, st)
	engine := idemtest.NewEngine(t, st, opts...)
	finisher := newFinisher(t, engine, nil, e.svc)

	// Each tenant's first run dies, as a crashed worker's would; the
	// finisher's run finishes it.
	var (
		mu       sync.Mutex
		runs     = map[string]int{}
		finished = map[string]int{}
	)
	e.svc.setHook(func(ctx context.Context, value string) error {
		mu.Lock()
		runs[value]++
		first := runs[value] == 1
		if !first {
			finished[value]++
		}
		mu.Unlock()
		if first {
			panic("worker dies")
		}
		return nil
	})
	for _, tenant := range []string{"alpha", "beta"} {
		_, err := e.client.Do(forTenant(tenant, "order-1"), &testv1.DoRequest{Value: tenant})
		wantCode(t, err, codes.Unknown)
	}
	// The interceptor ended the leases when the handlers died.
	for i, tenant := range []string{"alpha", "beta"} {
		if n := countOn(t, shards[i], `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND status = 'in_progress' AND request_payload IS NOT NULL`, tenant); n != 1 {
			t.Fatalf("shard %d holds %d abandoned calls of %s, want 1", i, n, tenant)
		}
	}

	n, err := finisher.Finish(t.Context())
	if err != nil || n != 2 {
		t.Fatalf("Finish = %d, %v; want the 2 abandoned calls, one on each shard, finished", n, err)
	}
	for i, tenant := range []string{"alpha", "beta"} {
		mu.Lock()
		done := finished[tenant]
		mu.Unlock()
		if done != 1 {
			t.Errorf("%s's call finished %d times, want 1", tenant, done)
		}
		if n := countOn(t, shards[i], `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND status = 'recorded' AND request_payload IS NULL`, tenant); n != 1 {
			t.Errorf("shard %d holds %d completed calls of %s, want 1", i, n, tenant)
		}
		if n := countOn(t, shards[1-i], `SELECT count(*) FROM idempotency_keys WHERE tenant = $1`, tenant); n != 0 {
			t.Errorf("shard %d holds %d keys of %s, want none", 1-i, n, tenant)
		}
		// The caller's late retry replays what the finisher recorded.
		var header metadata.MD
		if _, err := e.client.Do(forTenant(tenant, "order-1"), &testv1.DoRequest{Value: tenant}, grpc.Header(&header)); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Errorf("%s's late retry: %v (header %v), want a replay", tenant, err, header)
		}
	}
}

func TestFinisherTakesOnWhatTheShardsThatAnsweredListed(t *testing.T) {
	shards := twoShardDatabases(t)
	down, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	down.Close() // every query of a closed pool fails
	st := postgres.NewSharded([]*pgxpool.Pool{shards[0], down, shards[1]}, func(tenant string) int {
		return map[string]int{"alpha": 0, "beta": 2}[tenant]
	})
	opts := []idem.Option{
		idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute, Finish: true}),
		idem.WithTenant(idemtest.TenantFromHeader),
	}
	e := serveEnv(t, setup{opts: opts}, nil, st)
	finisher := newFinisher(t, idemtest.NewEngine(t, st, opts...), nil, e.svc)
	var crashed sync.Map
	e.svc.setHook(func(_ context.Context, value string) error {
		if _, again := crashed.LoadOrStore(value, true); !again {
			panic("worker dies")
		}
		return nil
	})
	_, err = e.client.Do(forTenant("beta", "order-1"), &testv1.DoRequest{Value: "beta"})
	wantCode(t, err, codes.Unknown)

	n, err := finisher.Finish(t.Context())
	if n != 1 {
		t.Fatalf("Finish = %d, %v; want beta's call finished though shard 1 is down", n, err)
	}
	if err == nil || !strings.Contains(err.Error(), "shard 1") {
		t.Fatalf("Finish's error = %v, want one that names shard 1", err)
	}
	if n := countOn(t, shards[1], `SELECT count(*) FROM idempotency_keys WHERE tenant = 'beta' AND status = 'recorded'`); n != 1 {
		t.Fatalf("shard 2 holds %d completed calls of beta, want 1", n)
	}
}
