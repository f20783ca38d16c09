package storetest

import (
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// counter returns s as a store.ReplayCounter, failing the test if it is
// none: the Replays cases run only for stores that implement it (see Run).
func counter(t *testing.T, s store.Store) store.ReplayCounter {
	t.Helper()
	c, ok := s.(store.ReplayCounter)
	if !ok {
		t.Fatalf("the store (%T) does not implement store.ReplayCounter, though the first store built did", s)
	}
	return c
}

// flushReplays flushes c's counts, failing the test on an error.
func flushReplays(t *testing.T, c store.ReplayCounter) {
	t.Helper()
	if err := c.FlushReplays(t.Context()); err != nil {
		t.Fatalf("FlushReplays: %v", err)
	}
}

// wantReplays fails the test unless k's entry shows n replays, the last
// at last (none when n is 0), through Key and through Keys.
func wantReplays(t *testing.T, s store.Store, k store.Scope, n int64, last time.Time) {
	t.Helper()
	a := admin(t, s)
	ki := keyInfo(t, a, k)
	listed := listAll(t, a, store.KeyFilter{Tenant: k.Tenant, Method: k.Method}, 100)
	for _, got := range append([]store.KeyInfo{ki}, listed...) {
		if got.Scope != k {
			continue
		}
		if got.Replays != n {
			t.Errorf("%v shows %d replays, want %d", k, got.Replays, n)
		}
		switch {
		case n == 0 && !got.LastReplay.IsZero():
			t.Errorf("%v shows its last replay at %v, want none", k, got.LastReplay)
		case n > 0:
			wantAbout(t, "the last replay", got.LastReplay, last)
		}
	}
}

// replayCases exercise store.ReplayCounter, through store.Admin.
var replayCases = []testCase{
	{name: "CountedOnceFlushed", run: func(t *testing.T, s store.Store, cfg Config) {
		c := counter(t, s)
		other := keyOf(key.Tenant, key.Method, "not-replayed")
		recordKey(t, s, key, okOutcome("done"))
		recordKey(t, s, other, okOutcome("done"))
		wantReplays(t, s, key, 0, time.Time{})

		for range 3 {
			c.CountReplay(key)
		}
		cfg.advance(time.Minute)
		c.CountReplay(key)
		last := cfg.Now()
		flushReplays(t, c)
		wantReplays(t, s, key, 4, last)
		wantReplays(t, s, other, 0, time.Time{})

		// A flush with nothing new adds nothing; later counts add up.
		flushReplays(t, c)
		wantReplays(t, s, key, 4, last)
		cfg.advance(time.Minute)
		c.CountReplay(key)
		c.CountReplay(key)
		flushReplays(t, c)
		wantReplays(t, s, key, 6, cfg.Now())
	}},
	{name: "ConcurrentCountsExact", run: func(t *testing.T, s store.Store, cfg Config) {
		c := counter(t, s)
		keys := []store.Scope{keyOf(key.Tenant, key.Method, "a"), keyOf("other-tenant", key.Method, "b")}
		for _, k := range keys {
			recordKey(t, s, k, okOutcome("done"))
		}
		const callers, each = 16, 50
		concurrently(callers, func(i int) {
			for range each {
				c.CountReplay(keys[i%2])
			}
		})
		flushReplays(t, c)
		for _, k := range keys {
			wantReplays(t, s, k, callers/2*each, cfg.Now())
		}
	}},
	{name: "FlushOfForgottenKeyIsNoop", run: func(t *testing.T, s store.Store, cfg Config) {
		c := counter(t, s)
		recordKey(t, s, key, okOutcome("first"))
		c.CountReplay(key)
		if err := admin(t, s).Forget(t.Context(), key, store.ForgetOptions{}); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		flushReplays(t, c)
		recordKey(t, s, key, okOutcome("second"))
		wantReplays(t, s, key, 0, time.Time{})
	}},
	{name: "TakeoverOfExpiredStartsAtZero", cfg: Config{TTL: time.Minute}, run: func(t *testing.T, s store.Store, cfg Config) {
		c := counter(t, s)
		recordKey(t, s, key, okOutcome("first"))
		recordKey(t, s, leaseKey, okOutcome("first"))
		c.CountReplay(key)
		c.CountReplay(leaseKey)
		flushReplays(t, c)
		wantReplays(t, s, key, 1, cfg.Now())
		wantReplays(t, s, leaseKey, 1, cfg.Now())

		cfg.advance(2 * time.Minute)
		recordKey(t, s, key, okOutcome("second"))
		wantReplays(t, s, key, 0, time.Time{})
		takeLease(t, s, leaseKey, fp, time.Hour)
		wantReplays(t, s, leaseKey, 0, time.Time{})
	}},
	{name: "InProgressNotCounted", run: func(t *testing.T, s store.Store, cfg Config) {
		c := counter(t, s)
		takeLease(t, s, leaseKey, fp, time.Hour)
		c.CountReplay(leaseKey)
		c.CountReplay(keyOf(key.Tenant, key.Method, "never-claimed"))
		flushReplays(t, c)
		wantReplays(t, s, leaseKey, 0, time.Time{})
	}},
}
