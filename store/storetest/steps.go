package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

func point(step, data string) store.Step {
	return store.Step{Name: step, Result: []byte(data)}
}

var stepCases = []testCase{
	{name: "EveryStepIsKeptInOrder", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, time.Minute)
		wantSteps(t, l)
		for _, p := range []store.Step{point("reserve", "r1"), point("charge", "ch_1"), point("reserve", "r2")} {
			if err := l.SaveStep(t.Context(), p); err != nil {
				t.Fatal(err)
			}
		}
		// Saving a step again keeps its place, with its new data.
		wantSteps(t, l, point("reserve", "r2"), point("charge", "ch_1"))
	}},

	{name: "StepsSurviveATakeover", run: func(t *testing.T, s store.Store, cfg Config) {
		first := takeLease(t, s, key, fp, 200*time.Millisecond)
		for _, p := range []store.Step{point("reserve", "r1"), point("charge", "ch_1")} {
			if err := first.SaveStep(t.Context(), p); err != nil {
				t.Fatal(err)
			}
		}
		cfg.advance(300 * time.Millisecond)
		second := takeLease(t, s, key, fp, time.Minute)
		wantSteps(t, second, point("reserve", "r1"), point("charge", "ch_1"))
	}},

	{name: "FencedOwnerSavesNoStep", run: func(t *testing.T, s store.Store, cfg Config) {
		// What idem.Step relies on: an owner whose key was taken
		// over learns it from Extend, before it runs a step, and from
		// then on every write of its lease fails; the new owner's steps
		// stand.
		stale := takeLease(t, s, key, fp, shortLease)
		if err := stale.SaveStep(t.Context(), point("s1", "r1")); err != nil {
			t.Fatal(err)
		}
		cfg.advance(runOut)
		owner := takeLease(t, s, key, fp, longLease)
		if err := owner.SaveStep(t.Context(), point("s2", "c1")); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := stale.Extend(t.Context(), longLease); !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("the stale owner's Extend: %v, want ErrLeaseLost", err)
			}
		}
		if err := stale.SaveStep(t.Context(), point("s2", "stale")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("the stale owner's SaveStep: %v, want ErrLeaseLost", err)
		}
		if err := owner.Record(t.Context(), okOutcome("owner")); err != nil {
			t.Fatalf("the new owner's Record: %v", err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("owner"))
		wantSteps(t, owner, point("s1", "r1"), point("s2", "c1"))
	}},

	{name: "StepsAreBounded", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, time.Minute)
		for i := range store.MaxSteps {
			if err := l.SaveStep(t.Context(), point(fmt.Sprint("s", i), "x")); err != nil {
				t.Fatalf("step %d of %d: %v", i+1, store.MaxSteps, err)
			}
		}
		err := l.SaveStep(t.Context(), point("one-too-many", "x"))
		if !errors.Is(err, store.ErrInvalidStep) {
			t.Fatalf("step %d: %v, want ErrInvalidStep", store.MaxSteps+1, err)
		}
		if n := len(l.Steps()); n != store.MaxSteps {
			t.Errorf("%d steps after a refused one, want %d", n, store.MaxSteps)
		}

		big := takeLease(t, s, store.Scope{Tenant: key.Tenant, Method: key.Method, Key: "big"}, fp, time.Minute)
		data := bytes.Repeat([]byte{7}, store.MaxStepResultBytes)
		var err2 error
		saved := 0
		for i := range store.MaxStepsBytes/len(data) + 1 {
			if err2 = big.SaveStep(t.Context(), store.Step{Name: fmt.Sprint("b", i), Result: data}); err2 != nil {
				break
			}
			saved++
		}
		if !errors.Is(err2, store.ErrInvalidStep) || saved*len(data) > store.MaxStepsBytes {
			t.Fatalf("after %d steps of %d bytes: %v; want ErrInvalidStep before %d bytes", saved, len(data), err2, store.MaxStepsBytes)
		}
	}},
}

// finishing returns s as store.Finishing, failing the test if it is none:
// the Finishing cases run only for stores that implement it (see Run).
func finishing(t *testing.T, s store.Store) store.Finishing {
	t.Helper()
	c, ok := s.(store.Finishing)
	if !ok {
		t.Fatalf("the store (%T) does not implement store.Finishing, though the first store built did", s)
	}
	return c
}

// keptCall is the call the Finishing cases' leased claims keep.
var keptCall = &store.Call{
	Method:   "/idem.test.v1.Test/Do",
	Request:  []byte("request bytes"),
	Metadata: map[string][]string{"x-user": {"u1"}, "x-roles": {"a", "b"}, "x-trace-bin": {"\x00\xff\x80 binary"}},
}

// abandonedKeys returns the keys Abandoned lists.
func abandonedKeys(t *testing.T, c store.Finishing, grace time.Duration) []store.AbandonedCall {
	t.Helper()
	list, err := c.Abandoned(t.Context(), grace, 100)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

var finishingCases = []testCase{
	{name: "AbandonedLeaseIsListedWithItsRequest", run: func(t *testing.T, s store.Store, cfg Config) {
		c := finishing(t, s)
		lc, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Call: keptCall, Lease: 100 * time.Millisecond})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease: %s, %v", describeLeasedClaim(lc), err)
		}
		// Without a kept call, or still leased: not listed.
		_ = takeLease(t, s, store.Scope{Tenant: key.Tenant, Method: key.Method, Key: "plain"}, fp, 100*time.Millisecond)
		if got := abandonedKeys(t, c, 0); len(got) != 0 {
			t.Fatalf("Abandoned during the lease: %v", got)
		}
		cfg.advance(250 * time.Millisecond)
		if got := abandonedKeys(t, c, time.Hour); len(got) != 0 {
			t.Fatalf("Abandoned within the grace period: %v", got)
		}
		got := abandonedKeys(t, c, 50*time.Millisecond)
		if len(got) != 1 {
			t.Fatalf("Abandoned = %v, want the one key", got)
		}
		a := got[0]
		if a.Scope != key || !bytes.Equal(a.Fingerprint, fp) || a.Takeovers != 0 ||
			a.Call.Method != keptCall.Method || !bytes.Equal(a.Call.Request, keptCall.Request) ||
			!slices.Equal(a.Call.Metadata["x-roles"], []string{"a", "b"}) || !slices.Equal(a.Call.Metadata["x-user"], []string{"u1"}) {
			t.Fatalf("Abandoned = %+v", a)
		}

		// Taken over as a retry would: counted, and spaced further.
		taker := takeLease(t, s, key, fp, 100*time.Millisecond)
		cfg.advance(250 * time.Millisecond)
		if got := abandonedKeys(t, c, 100*time.Millisecond); len(got) != 0 {
			t.Fatalf("Abandoned after a takeover, before twice the grace: %v", got)
		}
		if got := abandonedKeys(t, c, 50*time.Millisecond); len(got) != 1 || got[0].Takeovers != 1 {
			t.Fatalf("Abandoned after a takeover = %v, want the key with 1 takeover", got)
		}
		_ = taker
	}},

	{name: "ReleaseKeepsAFinishableClaim", run: func(t *testing.T, s store.Store, _ Config) {
		c := finishing(t, s)
		lc, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Call: keptCall, Lease: time.Hour})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease: %s, %v", describeLeasedClaim(lc), err)
		}
		// A transient failure before any step: the claim and its request
		// stay, for a retry or a finisher, and the lease ends at once.
		if err := lc.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		got := abandonedKeys(t, c, 0)
		if len(got) != 1 || got[0].Scope != key || !bytes.Equal(got[0].Call.Request, keptCall.Request) {
			t.Fatalf("Abandoned after Release = %v, want the key with its request", got)
		}
		// Another request under the key is refused; the same one takes over.
		other, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: other, Call: keptCall, Lease: time.Hour})
		if err != nil || other.Lease != nil || other.Entry == nil {
			t.Fatalf("lease with another fingerprint: %s, %v; want the entry in progress", describeLeasedClaim(other), err)
		}
		taker, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Lease: time.Hour})
		if err != nil || taker.Lease == nil || !taker.TookOver {
			t.Fatalf("lease after Release: %s (took over: %v), %v; want a takeover", describeLeasedClaim(taker), taker.TookOver, err)
		}
		// The takeover without a call of its own to keep keeps the request.
		if err := taker.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := abandonedKeys(t, c, 0); len(got) != 1 {
			t.Fatalf("Abandoned after the second Release = %v, want the key", got)
		}
	}},

	{name: "RecordedOutcomeDropsTheRequest", run: func(t *testing.T, s store.Store, cfg Config) {
		c := finishing(t, s)
		lc, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Call: keptCall, Lease: 100 * time.Millisecond})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease: %s, %v", describeLeasedClaim(lc), err)
		}
		if err := lc.Lease.Record(t.Context(), okOutcome("done")); err != nil {
			t.Fatal(err)
		}
		cfg.advance(150 * time.Millisecond)
		if got := abandonedKeys(t, c, 0); len(got) != 0 {
			t.Fatalf("Abandoned lists a recorded call: %v", got)
		}
	}},

	{name: "ExpiredCallIsNotListed", cfg: Config{TTL: time.Second, LockTimeout: 10 * time.Second}, run: func(t *testing.T, s store.Store, cfg Config) {
		c := finishing(t, s)
		lc, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Call: keptCall, Lease: 100 * time.Millisecond})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease: %s, %v", describeLeasedClaim(lc), err)
		}
		cfg.advance(cfg.TTL + 300*time.Millisecond)
		if got := abandonedKeys(t, c, 0); len(got) != 0 {
			t.Fatalf("Abandoned lists an expired call: %v", got)
		}
	}},
}
