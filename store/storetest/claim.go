package storetest

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/store"
)

// claimCases exercise Store.Claim and Txn: atomic mode.
var claimCases = []testCase{
	{name: "FreeKeyGivesTxn", run: func(t *testing.T, s store.Store, _ Config) {
		txn := claimTxn(t, s, key, fp)
		type ctxKey struct{}
		parent, cancel := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "v"))
		defer cancel()
		ctx := txn.Context(parent)
		if ctx.Value(ctxKey{}) != "v" {
			t.Error("Txn.Context dropped a value of its parent")
		}
		cancel()
		if ctx.Err() == nil {
			t.Error("Txn.Context is not derived from its parent: cancelling the parent left it live")
		}
		if err := txn.Record(t.Context(), okOutcome("r")); err != nil {
			t.Fatalf("Record: %v", err)
		}
	}},

	{name: "RecordThenReplay", run: func(t *testing.T, s store.Store, cfg Config) {
		for _, tc := range []struct {
			name string
			out  store.Outcome
		}{
			{"OK", okOutcome("response")},
			{"OKEmpty", store.Outcome{Code: code.Code_OK}},
			{"DeterministicError", errorOutcome()},
			{"NotCachedWithReference", store.Outcome{Code: code.Code_OK, Body: []byte("order-42"), NotCached: true}},
			{"NotCachedWithoutReference", store.Outcome{Code: code.Code_OK, NotCached: true}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				k := key
				k.Key = tc.name
				claimed := cfg.Now()
				txn := claimTxn(t, s, k, fp)
				if err := txn.Record(t.Context(), tc.out); err != nil {
					t.Fatalf("Record: %v", err)
				}
				e := claimEntry(t, s, k, fp)
				wantRecorded(t, e, fp, tc.out)
				wantAbout(t, "ExpiresAt", e.ExpiresAt, claimed.Add(cfg.TTL))
			})
		}
	}},

	{name: "DifferentFingerprintSeesFirst", run: func(t *testing.T, s store.Store, _ Config) {
		txn := claimTxn(t, s, key, fp)
		if err := txn.Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, other), fp, okOutcome("first"))
		// The mismatch changed nothing.
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("first"))
	}},

	{name: "ReleaseLeavesNoTrace", run: func(t *testing.T, s store.Store, _ Config) {
		txn := claimTxn(t, s, key, fp)
		if err := txn.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		// Free again, even for another request: nothing of the first remains.
		again := claimTxn(t, s, key, other)
		if err := again.Record(t.Context(), okOutcome("second")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), other, okOutcome("second"))
	}},

	{name: "ReleaseAfterRecordIsNoOp", run: func(t *testing.T, s store.Store, _ Config) {
		txn := claimTxn(t, s, key, fp)
		if err := txn.Record(t.Context(), okOutcome("kept")); err != nil {
			t.Fatal(err)
		}
		if err := txn.Release(t.Context()); err != nil {
			t.Errorf("Release after Record: %v, want nil", err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("kept"))
	}},

	{name: "RecordTwiceFails", run: func(t *testing.T, s store.Store, _ Config) {
		txn := claimTxn(t, s, key, fp)
		if err := txn.Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatal(err)
		}
		if err := txn.Record(t.Context(), okOutcome("second")); err == nil {
			t.Error("second Record succeeded, want an error")
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("first"))
	}},

	{name: "RecordAfterReleaseFails", run: func(t *testing.T, s store.Store, _ Config) {
		txn := claimTxn(t, s, key, fp)
		if err := txn.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := txn.Record(t.Context(), okOutcome("late")); err == nil {
			t.Error("Record after Release succeeded, want an error")
		}
		_ = claimTxn(t, s, key, fp) // still free
	}},

	{name: "OutcomeAndFingerprintAreCopied", run: func(t *testing.T, s store.Store, _ Config) {
		f := bytes.Clone(fp)
		txn := claimTxn(t, s, key, f)
		out := okOutcome("response")
		if err := txn.Record(t.Context(), out); err != nil {
			t.Fatal(err)
		}
		copy(out.Body, "XXXXXXXX")
		copy(f, "XXXXXXXX")
		e := claimEntry(t, s, key, fp)
		wantRecorded(t, e, fp, okOutcome("response"))
		copy(e.Outcome.Body, "YYYYYYYY")
		copy(e.Fingerprint, "YYYYYYYY")
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("response"))
	}},

	{name: "ConcurrentClaimsHaveOneOwner", run: func(t *testing.T, s store.Store, _ Config) {
		const n = 50
		var r tally
		var called sync.WaitGroup
		called.Add(n)
		concurrently(n, func(int) {
			called.Done()
			c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: fp})
			switch {
			case err != nil:
				r.err(err)
			case c.Txn != nil:
				r.owner()
				// The others have all called Claim while the key is held:
				// they wait for it, or find it recorded.
				called.Wait()
				if err := c.Txn.Record(t.Context(), okOutcome("owner")); err != nil {
					r.err(err)
				}
			default:
				r.entry(c.Entry)
			}
		})
		if r.owners != 1 || len(r.entries) != n-1 || len(r.errs) != 0 {
			t.Fatalf("%d owners, %d entries, errors %v; want 1 owner and %d entries", r.owners, len(r.entries), r.errs, n-1)
		}
		for _, e := range r.entries {
			wantRecorded(t, e, fp, okOutcome("owner"))
		}
	}},

	{name: "WaitForOwnerIsBounded", cfg: Config{TTL: time.Hour, LockTimeout: 300 * time.Millisecond}, run: func(t *testing.T, s store.Store, cfg Config) {
		warm(t, s, 2)
		owner := claimTxn(t, s, key, fp)
		start := time.Now()
		c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: fp})
		waited := time.Since(start)
		if !isInUse(err) {
			if c.Txn != nil {
				_ = c.Txn.Release(t.Context())
			}
			t.Fatalf("claim of a held key = %s, %v; want ErrInUse", describeClaim(c), err)
		}
		if waited < cfg.LockTimeout/2 {
			t.Errorf("gave up after %v, want a wait of about the lock timeout %v", waited, cfg.LockTimeout)
		}
		// The key is not lost: the owner still records, and it is replayed.
		if err := owner.Record(t.Context(), okOutcome("owner")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("owner"))
	}},

	{name: "WaitEndsWithContext", run: func(t *testing.T, s store.Store, cfg Config) {
		_ = claimTxn(t, s, key, fp)
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: fp})
		waited := time.Since(start)
		if err == nil {
			if c.Txn != nil {
				_ = c.Txn.Release(t.Context())
			}
			t.Fatalf("claim with an ending context = %s, want an error", describeClaim(c))
		}
		if waited > cfg.LockTimeout/2 {
			t.Errorf("claim returned %v after its context ended (lock timeout %v)", waited, cfg.LockTimeout)
		}
	}},

	{name: "OwnerReleasesWhileOthersWait", run: func(t *testing.T, s store.Store, _ Config) {
		first := claimTxn(t, s, key, fp)
		const n = 10
		var r tally
		var called sync.WaitGroup
		called.Add(n)
		released := make(chan error, 1)
		go func() {
			called.Wait() // the others all called Claim while the key was held
			released <- first.Release(context.Background())
		}()
		concurrently(n, func(int) {
			called.Done()
			c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: fp})
			switch {
			case err != nil:
				r.err(err)
			case c.Txn != nil:
				r.owner()
				if err := c.Txn.Record(t.Context(), okOutcome("second")); err != nil {
					r.err(err)
				}
			default:
				r.entry(c.Entry)
			}
		})
		if err := <-released; err != nil {
			t.Fatalf("Release of the first owner: %v", err)
		}
		if r.owners != 1 || len(r.entries) != n-1 || len(r.errs) != 0 {
			t.Fatalf("%d owners, %d entries, errors %v; want 1 owner and %d entries", r.owners, len(r.entries), r.errs, n-1)
		}
		for _, e := range r.entries {
			wantRecorded(t, e, fp, okOutcome("second"))
		}
	}},

	{name: "ExpiredKeyIsFree", cfg: Config{TTL: time.Second, LockTimeout: 10 * time.Second}, run: func(t *testing.T, s store.Store, cfg Config) {
		txn := claimTxn(t, s, key, fp)
		if err := txn.Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("first"))
		cfg.advance(cfg.TTL / 2)
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("first")) // not yet
		cfg.advance(cfg.TTL/2 + 300*time.Millisecond)
		// Expired counts as absent: even another fingerprint runs afresh.
		again := claimTxn(t, s, key, other)
		if err := again.Record(t.Context(), okOutcome("second")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), other, okOutcome("second"))
	}},

	{name: "ExpiryIsClaimTimePlusTTL", run: func(t *testing.T, s store.Store, cfg Config) {
		before := cfg.Now()
		c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: fp})
		if err != nil || c.Txn == nil {
			t.Fatalf("claim: %s, %v", describeClaim(c), err)
		}
		defer func() { _ = c.Txn.Release(context.Background()) }()
		wantAbout(t, "the claim's expiry", c.ExpiresAt, before.Add(cfg.TTL))
		if err := c.Txn.Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatal(err)
		}
		e := claimEntry(t, s, key, fp)
		if d := e.ExpiresAt.Sub(c.ExpiresAt).Abs(); d > 10*time.Millisecond {
			t.Errorf("the entry expires at %v, %v from the claim's %v", e.ExpiresAt, d, c.ExpiresAt)
		}

		l, err := s.ClaimLeased(t.Context(), leaseKey, store.LeaseRequest{Fingerprint: fp, Lease: time.Minute})
		if err != nil || l.Lease == nil {
			t.Fatalf("lease: %s, %v", describeLeasedClaim(l), err)
		}
		defer func() { _ = l.Lease.Release(context.Background()) }()
		wantAbout(t, "the lease's expiry", l.ExpiresAt, before.Add(cfg.TTL))
	}},

	{name: "RequestTTLOverridesTheStores", run: func(t *testing.T, s store.Store, cfg Config) {
		const ttl = time.Second // the store's is an hour
		before := cfg.Now()
		c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: fp, TTL: ttl})
		if err != nil || c.Txn == nil {
			t.Fatalf("claim: %s, %v", describeClaim(c), err)
		}
		wantAbout(t, "the claim's expiry", c.ExpiresAt, before.Add(ttl))
		if err := c.Txn.Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatal(err)
		}
		l, err := s.ClaimLeased(t.Context(), leaseKey, store.LeaseRequest{Fingerprint: fp, TTL: ttl, Lease: time.Minute})
		if err != nil || l.Lease == nil {
			t.Fatalf("lease: %s, %v", describeLeasedClaim(l), err)
		}
		if err := l.Lease.Record(t.Context(), okOutcome("leased")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("first"))
		cfg.advance(ttl + 300*time.Millisecond)
		claimTxn(t, s, key, fp)
		_ = takeLease(t, s, leaseKey, fp, time.Minute)
	}},

	{name: "ConcurrentClaimsOfExpiredKeyHaveOneOwner", cfg: Config{TTL: 2 * time.Second, LockTimeout: 10 * time.Second}, run: func(t *testing.T, s store.Store, cfg Config) {
		txn := claimTxn(t, s, key, fp)
		if err := txn.Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatal(err)
		}
		cfg.advance(cfg.TTL + 300*time.Millisecond)
		const n = 20
		var r tally
		var called sync.WaitGroup
		called.Add(n)
		concurrently(n, func(int) {
			called.Done()
			c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: fp})
			switch {
			case err != nil:
				r.err(err)
			case c.Txn != nil:
				r.owner()
				called.Wait() // the others called Claim while the key was held
				if err := c.Txn.Record(t.Context(), okOutcome("second")); err != nil {
					r.err(err)
				}
			default:
				r.entry(c.Entry)
			}
		})
		if r.owners != 1 || len(r.entries) != n-1 || len(r.errs) != 0 {
			t.Fatalf("%d owners, %d entries, errors %v; want 1 owner and %d entries", r.owners, len(r.entries), r.errs, n-1)
		}
		for _, e := range r.entries {
			wantRecorded(t, e, fp, okOutcome("second"))
		}
	}},

	{name: "KeysAreScopedByTenantMethodAndKey", run: func(t *testing.T, s store.Store, _ Config) {
		keys := []store.Scope{
			key,
			{Tenant: "other-tenant", Method: key.Method, Key: key.Key},
			{Tenant: key.Tenant, Method: "/idem.test.v1.Test/Other", Key: key.Key},
			{Tenant: key.Tenant, Method: key.Method, Key: "key-2"},
			{Tenant: "", Method: key.Method, Key: key.Key},
			// Fields that run together into the same string.
			{Tenant: "a/b", Method: "c", Key: "d"},
			{Tenant: "a", Method: "b/c", Key: "d"},
			{Tenant: "a:b", Method: "c", Key: "d"},
			{Tenant: "a", Method: "b:c", Key: "d"},
			{Tenant: "a", Method: "b", Key: "c:d"},
		}
		// Each key is free although all before it are recorded: a
		// collision shows as an Entry.
		for _, k := range keys {
			txn := claimTxn(t, s, k, fp)
			if err := txn.Record(t.Context(), okOutcome(k.Tenant+"|"+k.Method+"|"+k.Key)); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys {
			wantRecorded(t, claimEntry(t, s, k, fp), fp, okOutcome(k.Tenant+"|"+k.Method+"|"+k.Key))
		}
		// A held key does not make another one wait.
		_ = claimTxn(t, s, store.Scope{Tenant: "a/b", Method: "c", Key: "e"}, fp)
		start := time.Now()
		_ = claimTxn(t, s, store.Scope{Tenant: "a", Method: "b/c", Key: "e"}, fp)
		if waited := time.Since(start); waited > 2*time.Second {
			t.Errorf("claim of a free key took %v while another key was held", waited)
		}
	}},

	{name: "LiveLeaseIsNeverClaimed", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, time.Minute)
		for _, f := range [][]byte{fp, other} {
			c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: f})
			switch {
			case isInUse(err):
			case err != nil:
				t.Fatalf("Claim of a leased key: %v", err)
			case c.Txn != nil:
				_ = c.Txn.Release(t.Context())
				t.Fatalf("Claim of a leased key got a Txn")
			default:
				wantInProgress(t, c.Entry, fp)
				if r := c.Entry.LeaseRemaining; r <= 0 || r > time.Minute {
					t.Errorf("LeaseRemaining %v, want in (0, 1m]", r)
				}
			}
		}
		if err := l.Record(t.Context(), okOutcome("leased")); err != nil {
			t.Fatalf("the lease was disturbed by the claims: %v", err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("leased"))
	}},

	{name: "RunOutLeaseIsNeverClaimed", run: func(t *testing.T, s store.Store, cfg Config) {
		l := takeLease(t, s, key, fp, 200*time.Millisecond)
		cfg.advance(400 * time.Millisecond)
		// Only ClaimLeased takes a run-out lease over; an atomic claim does not.
		c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: fp})
		switch {
		case isInUse(err):
		case err != nil:
			t.Fatalf("Claim of a run-out lease: %v", err)
		case c.Txn != nil:
			_ = c.Txn.Release(t.Context())
			t.Fatalf("Claim of a run-out lease got a Txn")
		default:
			wantInProgress(t, c.Entry, fp)
			if c.Entry.LeaseRemaining != 0 {
				t.Errorf("LeaseRemaining %v of a run-out lease, want 0", c.Entry.LeaseRemaining)
			}
		}
		if err := l.Record(t.Context(), okOutcome("leased")); err != nil {
			t.Fatalf("the lease was disturbed by the claim: %v", err)
		}
	}},
}
