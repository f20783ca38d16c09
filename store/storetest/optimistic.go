package storetest

import (
	"errors"
	"testing"

	"github.com/idemkit/idem/store"
)

// optimisticCases exercise claims with ClaimRequest.Optimistic set, which a
// store may read before the handler or not: either way a key's recorded
// outcome stands, and a free key is recorded; an expired key is recorded
// by the optimistic claim or, after its ErrConflict, by an atomic claim.
var optimisticCases = []testCase{
	{name: "FreeKeyRecords", run: func(t *testing.T, s store.Store, cfg Config) {
		claimed := cfg.Now()
		c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: fp, Optimistic: true})
		if err != nil || c.Txn == nil {
			t.Fatalf("optimistic Claim of a free key = %s, %v; want a Txn", describeClaim(c), err)
		}
		wantAbout(t, "ExpiresAt", c.ExpiresAt, claimed.Add(cfg.TTL))
		if err := c.Txn.Record(t.Context(), okOutcome("r")); err != nil {
			t.Fatalf("Record: %v", err)
		}
		e := claimEntry(t, s, key, fp)
		wantRecorded(t, e, fp, okOutcome("r"))
		wantAbout(t, "ExpiresAt", e.ExpiresAt, claimed.Add(cfg.TTL))
	}},

	{name: "RecordedKeyKeepsItsOutcome", run: func(t *testing.T, s store.Store, _ Config) {
		if err := claimTxn(t, s, key, fp).Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatal(err)
		}
		for _, f := range [][]byte{fp, other} {
			c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: f, Optimistic: true})
			switch {
			case err != nil:
				t.Fatalf("optimistic Claim of a recorded key: %v", err)
			case c.Entry != nil:
				// The store read the key first.
				wantRecorded(t, c.Entry, fp, okOutcome("first"))
			default:
				err := c.Txn.Record(t.Context(), okOutcome("second"))
				_ = c.Txn.Release(t.Context())
				if !errors.Is(err, store.ErrConflict) {
					t.Fatalf("Record of an optimistic claim of a recorded key: %v, want ErrConflict", err)
				}
			}
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("first"))
	}},

	{name: "ExpiredKeyIsTakenOver", run: func(t *testing.T, s store.Store, cfg Config) {
		if err := claimTxn(t, s, key, fp).Record(t.Context(), okOutcome("old")); err != nil {
			t.Fatal(err)
		}
		cfg.advance(cfg.TTL + 1)
		c, err := s.Claim(t.Context(), key, store.ClaimRequest{Fingerprint: other, Optimistic: true})
		if err != nil || c.Txn == nil {
			t.Fatalf("optimistic Claim of an expired key = %s, %v; want a Txn", describeClaim(c), err)
		}
		err = c.Txn.Record(t.Context(), okOutcome("new"))
		_ = c.Txn.Release(t.Context())
		switch {
		case errors.Is(err, store.ErrConflict):
			if err := claimTxn(t, s, key, other).Record(t.Context(), okOutcome("new")); err != nil {
				t.Fatalf("Record of the atomic claim after the conflict: %v", err)
			}
		case err != nil:
			t.Fatalf("Record over the expired key: %v, want nil or ErrConflict", err)
		}
		wantRecorded(t, claimEntry(t, s, key, other), other, okOutcome("new"))
	}},
}
