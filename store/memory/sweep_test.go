package memory

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/store"
)

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (s *Store) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

func TestSweepDropsKeysNobodyClaimsAgain(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	const ttl = time.Hour
	s := New(WithTTL(ttl), WithClock(clock.Now))
	claim := func(i int) {
		t.Helper()
		k := store.Scope{Tenant: "t", Method: "/s/M", Key: fmt.Sprint(i)}
		c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
		if err != nil || c.Txn == nil {
			t.Fatalf("claim %d: %+v, %v", i, c, err)
		}
		if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.ClaimLeased(ctx, store.Scope{Tenant: "t", Method: "/s/L", Key: "l"}, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: 10 * ttl})
	if err != nil || l.Lease == nil {
		t.Fatalf("lease: %+v, %v", l, err)
	}
	for i := range 100 {
		claim(i)
	}
	// Keys of two TTLs' traffic at most: each pass of a TTL sweeps what
	// expired before it.
	for round := 1; round <= 5; round++ {
		clock.Add(ttl / 2)
		for i := range 100 {
			claim(round*1000 + i)
		}
		if n := s.len(); n > 400 {
			t.Fatalf("round %d: %d keys held, want at most the last two TTLs' 400", round, n)
		}
	}
	// A lease whose key expired is lost, even though its lease still runs.
	if err := l.Lease.Record(ctx, store.Outcome{Code: code.Code_OK}); err != store.ErrLeaseLost {
		t.Errorf("Record of a lease whose key expired: %v, want ErrLeaseLost", err)
	}
}

func TestClockMovesLeases(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := New(WithClock(clock.Now))
	k := store.Scope{Tenant: "t", Method: "/s/M", Key: "k"}
	first, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || first.Lease == nil {
		t.Fatalf("lease: %+v, %v", first, err)
	}
	clock.Add(20 * time.Second)
	live, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || live.Entry == nil || live.Entry.LeaseRemaining != 40*time.Second {
		t.Fatalf("during the lease: %+v, %v; want an entry with 40s remaining", live, err)
	}
	clock.Add(40 * time.Second) // exactly at the end: run out
	second, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || second.Lease == nil {
		t.Fatalf("after the lease: %+v, %v; want a takeover", second, err)
	}
	if err := first.Lease.Extend(ctx, time.Hour); err != store.ErrLeaseLost {
		t.Errorf("Extend of the earlier owner: %v, want ErrLeaseLost", err)
	}
}

// TestAuditRetention: an audit entry past its retention is not listed,
// and the next sweep drops it; one within it stays.
func TestAuditRetention(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := New(WithClock(clock.Now), WithTTL(time.Hour), WithAuditRetention(2*time.Hour))
	k := store.Scope{Tenant: "t", Method: "/m", Key: "k"}
	add := func(reason string) {
		t.Helper()
		if err := s.AddAudit(ctx, store.AuditEntry{Scope: k, Action: store.ActionFinish, Before: store.Abandoned, Reason: reason}); err != nil {
			t.Fatal(err)
		}
	}
	add("old")
	clock.Add(90 * time.Minute)
	add("new")
	clock.Add(time.Hour) // "old" is 2.5 h old, "new" 1 h
	list, _, err := s.AuditLog(ctx, store.AuditFilter{Tenant: "t"})
	if err != nil || len(list) != 1 || list[0].Reason != "new" {
		t.Fatalf("AuditLog past the old entry's retention: %+v, %v; want the new one only", list, err)
	}
	// A claim sweeps (at most once per TTL): the old entry is dropped.
	if _, err := s.Claim(ctx, store.Scope{Tenant: "t", Method: "/m", Key: "other"}, store.ClaimRequest{Fingerprint: []byte("f")}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	n := len(s.audit)
	s.mu.Unlock()
	if n != 1 {
		t.Errorf("the store keeps %d audit entries after a sweep, want 1", n)
	}
}
