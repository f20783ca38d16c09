package postgres_test

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

// testClock is a clock for postgres.WithClock that moves only when told to.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock {
	return &testClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestClockIsTheStatementsTime: with WithClock, the times the store writes
// are the clock's, not the database's.
func TestClockIsTheStatementsTime(t *testing.T) {
	pool := pgtest.NewPool(t)
	clock := newTestClock()
	s := postgres.New(pool, postgres.WithClock(clock.Now), postgres.WithTTL(time.Hour))
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	if want := clock.Now().Add(time.Hour); !c.ExpiresAt.Equal(want) {
		t.Errorf("the claim expires at %v, want %v", c.ExpiresAt, want)
	}
	clock.Add(time.Minute) // while the handler runs: the record keeps the claim's time
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK}); err != nil {
		t.Fatal(err)
	}
	leased := store.Scope{Tenant: key.Tenant, Method: key.Method, Key: "leased"}
	l, err := s.ClaimLeased(ctx, leased, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: 10 * time.Minute})
	if err != nil || l.Lease == nil {
		t.Fatalf("lease: %+v, %v", l, err)
	}
	for k, want := range map[string]time.Time{
		key.Key:    clock.Now().Add(59 * time.Minute), // claimed a minute ago
		leased.Key: clock.Now().Add(time.Hour),
	} {
		var expires time.Time
		if err := pool.QueryRow(ctx, `SELECT expires_at FROM idempotency_keys WHERE key = $1`, k).Scan(&expires); err != nil {
			t.Fatal(err)
		}
		if !expires.Equal(want) {
			t.Errorf("key %q expires at %v, want %v", k, expires, want)
		}
	}
	var lockedUntil time.Time
	if err := pool.QueryRow(ctx, `SELECT locked_until FROM idempotency_keys WHERE key = 'leased'`).Scan(&lockedUntil); err != nil {
		t.Fatal(err)
	}
	if want := clock.Now().Add(10 * time.Minute); !lockedUntil.Equal(want) {
		t.Errorf("the lease runs until %v, want %v", lockedUntil, want)
	}
}

// TestDefaultClockIsTheDatabases: without WithClock, the store tells the
// time by the database's clock, which every server sharing it reads.
func TestDefaultClockIsTheDatabases(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool, postgres.WithTTL(time.Hour))
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK}); err != nil {
		t.Fatal(err)
	}
	var stored time.Time
	var sinceClaim float64 // seconds
	if err := pool.QueryRow(ctx, `SELECT expires_at, extract(epoch FROM now() - (expires_at - interval '1 hour'))::float8
FROM idempotency_keys`).Scan(&stored, &sinceClaim); err != nil {
		t.Fatal(err)
	}
	if !stored.Equal(c.ExpiresAt) {
		t.Errorf("the key expires at %v, and the claim said %v", stored, c.ExpiresAt)
	}
	if sinceClaim < 0 || sinceClaim > 60 {
		t.Errorf("the claim's time is %vs before the database's now, want within a minute", sinceClaim)
	}
}
