package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// Lease lengths of the cases: short ones run out within a case, long ones
// never do.
const (
	shortLease = 300 * time.Millisecond
	longLease  = time.Minute
	// runOut is how far to move the clock for a short lease to run out,
	// with margin.
	runOut = shortLease + 300*time.Millisecond
)

// leaseCases exercise Store.ClaimLeased and Lease: leased mode.
var leaseCases = []testCase{
	{name: "FreeKeyGivesLease", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, longLease)
		wantSteps(t, l)
		if err := l.Record(t.Context(), okOutcome("r")); err != nil {
			t.Fatalf("Record: %v", err)
		}
	}},

	{name: "LiveLeaseIsInProgress", run: func(t *testing.T, s store.Store, _ Config) {
		const d = 2 * time.Second
		l := takeLease(t, s, key, fp, d)
		for _, f := range [][]byte{fp, other} {
			e := leaseEntry(t, s, key, f, longLease)
			wantInProgress(t, e, fp)
			if r := e.LeaseRemaining; r <= 0 || r > d {
				t.Errorf("LeaseRemaining %v, want in (0, %v]", r, d)
			}
		}
		if err := l.Record(t.Context(), okOutcome("r")); err != nil {
			t.Fatalf("the lease was disturbed: %v", err)
		}
	}},

	{name: "ConcurrentLeasesHaveOneOwner", run: func(t *testing.T, s store.Store, _ Config) {
		const n = 20
		var r tally
		concurrently(n, func(int) {
			c, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Lease: longLease})
			switch {
			case err != nil:
				r.err(err)
			case c.Lease != nil:
				r.owner()
				t.Cleanup(func() { _ = c.Lease.Release(context.Background()) })
			default:
				r.entry(c.Entry)
			}
		})
		if r.owners != 1 || len(r.entries) != n-1 || len(r.errs) != 0 {
			t.Fatalf("%d owners, %d entries, errors %v; want 1 owner and %d entries", r.owners, len(r.entries), r.errs, n-1)
		}
		for _, e := range r.entries {
			wantInProgress(t, e, fp)
			if e.LeaseRemaining <= 0 {
				t.Errorf("LeaseRemaining %v, want > 0", e.LeaseRemaining)
			}
		}
	}},

	{name: "TakeoverKeepsSteps", run: func(t *testing.T, s store.Store, cfg Config) {
		first := takeLease(t, s, key, fp, shortLease)
		data := []byte("ch_1")
		for _, p := range []store.Step{{Name: "created"}, {Name: "charge_sent", Result: data}} {
			if err := first.SaveStep(t.Context(), p); err != nil {
				t.Fatalf("SaveStep(%q): %v", p.Name, err)
			}
		}
		copy(data, "XXXX") // the store kept its own copy
		wantSteps(t, first, store.Step{Name: "created"}, store.Step{Name: "charge_sent", Result: []byte("ch_1")})
		cfg.advance(runOut)
		second := takeLease(t, s, key, fp, longLease)
		wantSteps(t, second, store.Step{Name: "created"}, store.Step{Name: "charge_sent", Result: []byte("ch_1")})
		// The takeover holds the new lease length.
		e := leaseEntry(t, s, key, fp, longLease)
		wantInProgress(t, e, fp)
		if e.LeaseRemaining < longLease/2 {
			t.Errorf("LeaseRemaining %v after a takeover for %v", e.LeaseRemaining, longLease)
		}
		if err := second.Record(t.Context(), okOutcome("second")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("second"))
	}},

	{name: "TakeoverIsReported", run: func(t *testing.T, s store.Store, cfg Config) {
		first := takeLeasedClaim(t, s, key, fp, shortLease)
		if first.TookOver {
			t.Errorf("the lease of a free key reports a takeover")
		}
		cfg.advance(runOut)
		second := takeLeasedClaim(t, s, key, fp, longLease)
		if !second.TookOver {
			t.Errorf("the lease of a key whose lease ran out reports no takeover")
		}
		// A lease released with a saved step ends at once: the next
		// claim takes it over too.
		if err := second.Lease.SaveStep(t.Context(), store.Step{Name: "sent"}); err != nil {
			t.Fatal(err)
		}
		if err := second.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		third := takeLeasedClaim(t, s, key, fp, longLease)
		if !third.TookOver {
			t.Errorf("the lease of a key released with a saved step reports no takeover")
		}
		if err := third.Lease.Record(t.Context(), okOutcome("third")); err != nil {
			t.Fatal(err)
		}
		if c, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Lease: longLease}); err != nil || c.TookOver {
			t.Errorf("ClaimLeased of a recorded key = %s, %v; want its entry and no takeover", describeLeasedClaim(c), err)
		}
		// A key released without a saved step is free again.
		released := store.Scope{Tenant: key.Tenant, Method: key.Method, Key: "key-2"}
		fresh := takeLeasedClaim(t, s, released, fp, longLease)
		if err := fresh.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if again := takeLeasedClaim(t, s, released, fp, longLease); again.TookOver {
			t.Errorf("the lease of a released key reports a takeover")
		}
	}},

	{name: "RunOutLeaseWithOtherFingerprintIsNotTakenOver", run: func(t *testing.T, s store.Store, cfg Config) {
		l := takeLease(t, s, key, fp, shortLease)
		cfg.advance(runOut)
		e := leaseEntry(t, s, key, other, longLease)
		wantInProgress(t, e, fp)
		if e.LeaseRemaining != 0 {
			t.Errorf("LeaseRemaining %v of a run-out lease, want 0", e.LeaseRemaining)
		}
		// The holder was not fenced off: nobody took the key.
		if err := l.Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatalf("Record of the run-out lease: %v", err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("first"))
	}},

	{name: "ExtendKeepsLeaseLive", run: func(t *testing.T, s store.Store, cfg Config) {
		l := takeLease(t, s, key, fp, shortLease)
		cfg.advance(shortLease / 3)
		if err := l.Extend(t.Context(), longLease); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		cfg.advance(runOut) // past the lease's first end
		e := leaseEntry(t, s, key, fp, longLease)
		wantInProgress(t, e, fp)
		if e.LeaseRemaining < longLease/2 {
			t.Errorf("LeaseRemaining %v after Extend(%v)", e.LeaseRemaining, longLease)
		}
		if err := l.Record(t.Context(), okOutcome("first")); err != nil {
			t.Fatalf("Record of the extended lease: %v", err)
		}
	}},

	{name: "StaleOwnerIsFenced", run: func(t *testing.T, s store.Store, cfg Config) {
		for _, tc := range []struct {
			name  string
			write func(ctx context.Context, l store.Lease) error
			// check runs after the stale write, before the new owner
			// records, and sees that the write changed nothing.
			check func(t *testing.T, k store.Scope, owner store.Lease)
		}{
			{
				name:  "Extend",
				write: func(ctx context.Context, l store.Lease) error { return l.Extend(ctx, 10*longLease) },
				check: func(t *testing.T, k store.Scope, _ store.Lease) {
					e := leaseEntry(t, s, k, fp, longLease)
					wantInProgress(t, e, fp)
					if e.LeaseRemaining > longLease {
						t.Errorf("LeaseRemaining %v: the stale Extend moved the new owner's lease", e.LeaseRemaining)
					}
				},
			},
			{
				name: "SaveStep",
				write: func(ctx context.Context, l store.Lease) error {
					return l.SaveStep(ctx, store.Step{Name: "stale"})
				},
				check: func(t *testing.T, k store.Scope, owner store.Lease) {
					// Let the new owner's lease run out, and take over again:
					// the steps are the first owner's and the new owner's.
					if err := owner.Extend(t.Context(), 0); err != nil {
						t.Fatalf("Extend: %v", err)
					}
					third := takeLease(t, s, k, fp, longLease)
					wantSteps(t, third, store.Step{Name: "first"}, store.Step{Name: "second"})
					if err := third.Release(t.Context()); err != nil {
						t.Fatal(err)
					}
				},
			},
			{
				name:  "Record",
				write: func(ctx context.Context, l store.Lease) error { return l.Record(ctx, okOutcome("stale")) },
				check: func(t *testing.T, k store.Scope, _ store.Lease) {
					wantInProgress(t, leaseEntry(t, s, k, fp, longLease), fp)
				},
			},
			{
				name:  "Release",
				write: func(ctx context.Context, l store.Lease) error { return l.Release(ctx) },
				check: func(t *testing.T, k store.Scope, _ store.Lease) {
					wantInProgress(t, leaseEntry(t, s, k, fp, longLease), fp)
				},
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				k := key
				k.Key = tc.name
				stale := takeLease(t, s, k, fp, shortLease)
				if err := stale.SaveStep(t.Context(), store.Step{Name: "first"}); err != nil {
					t.Fatal(err)
				}
				cfg.advance(runOut)
				owner := takeLease(t, s, k, fp, longLease)
				if err := owner.SaveStep(t.Context(), store.Step{Name: "second"}); err != nil {
					t.Fatal(err)
				}
				if err := tc.write(t.Context(), stale); !errors.Is(err, store.ErrLeaseLost) {
					t.Errorf("stale %s: %v, want ErrLeaseLost", tc.name, err)
				}
				tc.check(t, k, owner)
				if tc.name == "SaveStep" {
					return // the owner was taken over in turn
				}
				if err := owner.Record(t.Context(), okOutcome("owner")); err != nil {
					t.Fatalf("the new owner's Record: %v", err)
				}
				wantRecorded(t, claimEntry(t, s, k, fp), fp, okOutcome("owner"))
			})
		}
	}},

	{name: "StaleOwnerIsFencedAfterKeyWasFreedAndLeasedAgain", run: func(t *testing.T, s store.Store, cfg Config) {
		stale := takeLease(t, s, key, fp, shortLease)
		cfg.advance(runOut)
		second := takeLease(t, s, key, fp, longLease)
		if err := second.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		// A new request, with another fingerprint, leases the free key.
		owner := takeLease(t, s, key, other, longLease)
		if err := stale.SaveStep(t.Context(), store.Step{Name: "stale"}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("stale SaveStep: %v, want ErrLeaseLost", err)
		}
		if err := stale.Extend(t.Context(), longLease); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("stale Extend: %v, want ErrLeaseLost", err)
		}
		if err := stale.Record(t.Context(), okOutcome("stale")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("stale Record: %v, want ErrLeaseLost", err)
		}
		wantInProgress(t, leaseEntry(t, s, key, other, longLease), other)
		if err := owner.Record(t.Context(), okOutcome("owner")); err != nil {
			t.Fatalf("the new owner's Record: %v", err)
		}
		wantRecorded(t, claimEntry(t, s, key, other), other, okOutcome("owner"))
	}},

	{name: "RecordIsReplayed", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, longLease)
		if err := l.SaveStep(t.Context(), store.Step{Name: "charge_confirmed"}); err != nil {
			t.Fatal(err)
		}
		out := errorOutcome()
		if err := l.Record(t.Context(), out); err != nil {
			t.Fatalf("Record: %v", err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("Release after Record: %v, want nil", err)
		}
		if err := l.Record(t.Context(), okOutcome("again")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("second Record: %v, want ErrLeaseLost", err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, out)
		wantRecorded(t, leaseEntry(t, s, key, fp, longLease), fp, out)
		wantRecorded(t, leaseEntry(t, s, key, other, longLease), fp, out)
	}},

	{name: "WritesAfterTheLeaseEndedAreLost", run: func(t *testing.T, s store.Store, _ Config) {
		// Once its Record or Release took effect, a lease is no longer its
		// holder's to write under: SaveStep, Extend and Record fail with
		// ErrLeaseLost and change nothing, every time; Release does nothing.
		ended := func(t *testing.T, l store.Lease, what string) {
			t.Helper()
			for i, w := range []struct {
				name  string
				write func() error
			}{
				{"Record", func() error { return l.Record(t.Context(), okOutcome("late")) }},
				{"SaveStep", func() error { return l.SaveStep(t.Context(), store.Step{Name: "late"}) }},
				{"Extend", func() error { return l.Extend(t.Context(), 10*longLease) }},
				{"Record", func() error { return l.Record(t.Context(), okOutcome("later")) }},
				{"Extend", func() error { return l.Extend(t.Context(), 10*longLease) }},
			} {
				if err := w.write(); !errors.Is(err, store.ErrLeaseLost) {
					t.Errorf("%s after %s (write %d): %v, want ErrLeaseLost", w.name, what, i+1, err)
				}
			}
			if err := l.Release(t.Context()); err != nil {
				t.Errorf("Release after %s: %v, want nil", what, err)
			}
		}

		recorded := keyOf(key.Tenant, key.Method, "recorded")
		l := takeLease(t, s, recorded, fp, longLease)
		if err := l.Record(t.Context(), errorOutcome()); err != nil {
			t.Fatalf("Record: %v", err)
		}
		ended(t, l, "its Record")
		wantRecorded(t, claimEntry(t, s, recorded, fp), fp, errorOutcome())

		// Released with a step: the key stays, its lease ended, for a retry
		// to take over at once, with the step the holder saved.
		released := keyOf(key.Tenant, key.Method, "released")
		l = takeLease(t, s, released, fp, longLease)
		point := store.Step{Name: "charge", Result: []byte("ch_1")}
		if err := l.SaveStep(t.Context(), point); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		ended(t, l, "its Release")
		retry := takeLeasedClaim(t, s, released, fp, longLease)
		if !retry.TookOver {
			t.Errorf("the retry after a Release did not take the key over: the released lease was extended")
		}
		// Only the step saved before the Release.
		wantSteps(t, retry.Lease, point)
		if err := retry.Lease.Record(t.Context(), okOutcome("retry")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, released, fp), fp, okOutcome("retry"))
	}},

	{name: "ReleaseFreesKey", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, longLease)
		if err := l.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := l.Record(t.Context(), okOutcome("late")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Record after Release: %v, want ErrLeaseLost", err)
		}
		again := takeLease(t, s, key, other, longLease)
		wantSteps(t, again)
		if err := again.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		txn := claimTxn(t, s, key, fp)
		if err := txn.Record(t.Context(), okOutcome("atomic")); err != nil {
			t.Fatal(err)
		}
	}},

	{name: "ReleaseAfterStepEndsLease", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, longLease)
		point := store.Step{Name: "charge_sent", Result: []byte("ch_1")}
		if err := l.SaveStep(t.Context(), point); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		// The progress stays: another request is still refused, and a
		// retry of this one takes over at once and resumes.
		wantInProgress(t, leaseEntry(t, s, key, other, longLease), fp)
		again := takeLease(t, s, key, fp, longLease)
		wantSteps(t, again, point)
		if err := l.Record(t.Context(), okOutcome("stale")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Record after Release: %v, want ErrLeaseLost", err)
		}
		if err := again.Record(t.Context(), okOutcome("resumed")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("resumed"))
	}},

	{name: "RecordedKeyIsNotLeased", run: func(t *testing.T, s store.Store, _ Config) {
		txn := claimTxn(t, s, key, fp)
		if err := txn.Record(t.Context(), okOutcome("atomic")); err != nil {
			t.Fatal(err)
		}
		for _, f := range [][]byte{fp, other} {
			wantRecorded(t, leaseEntry(t, s, key, f, longLease), fp, okOutcome("atomic"))
		}
	}},

	{name: "ConcurrentTakeoversHaveOneOwner", run: func(t *testing.T, s store.Store, cfg Config) {
		stale := takeLease(t, s, key, fp, shortLease)
		if err := stale.SaveStep(t.Context(), store.Step{Name: "charge_sent"}); err != nil {
			t.Fatal(err)
		}
		cfg.advance(runOut)
		const n = 20
		var r tally
		concurrently(n, func(int) {
			c, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Lease: longLease})
			switch {
			case err != nil:
				r.err(err)
			case c.Lease != nil:
				r.owner()
				t.Cleanup(func() { _ = c.Lease.Release(context.Background()) })
				if steps := c.Lease.Steps(); len(steps) != 1 || steps[0].Name != "charge_sent" {
					r.err(errors.New("the takeover lost the saved step"))
				}
			default:
				r.entry(c.Entry)
			}
		})
		if r.owners != 1 || len(r.entries) != n-1 || len(r.errs) != 0 {
			t.Fatalf("%d owners, %d entries, errors %v; want 1 owner and %d entries", r.owners, len(r.entries), r.errs, n-1)
		}
		for _, e := range r.entries {
			wantInProgress(t, e, fp)
			if e.LeaseRemaining <= 0 {
				t.Errorf("LeaseRemaining %v, want > 0", e.LeaseRemaining)
			}
		}
		if err := stale.Record(t.Context(), okOutcome("stale")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("stale Record: %v, want ErrLeaseLost", err)
		}
	}},

	{name: "ExpiredKeyIsLeasedAfresh", cfg: Config{TTL: time.Second, LockTimeout: 10 * time.Second}, run: func(t *testing.T, s store.Store, cfg Config) {
		// The lease outlives the key: expiry wins.
		stale := takeLease(t, s, key, fp, longLease)
		if err := stale.SaveStep(t.Context(), store.Step{Name: "charge_sent"}); err != nil {
			t.Fatal(err)
		}
		cfg.advance(cfg.TTL + 300*time.Millisecond)
		c := takeLeasedClaim(t, s, key, other, longLease)
		if c.TookOver {
			t.Errorf("the lease of an expired key reports a takeover")
		}
		l := c.Lease
		wantSteps(t, l)
		if err := stale.Record(t.Context(), okOutcome("stale")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Record of the expired lease after the key was leased again: %v, want ErrLeaseLost", err)
		}
		if err := l.Record(t.Context(), okOutcome("fresh")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, other), other, okOutcome("fresh"))
	}},

	{name: "ExpiredLeaseWritesNothing", cfg: Config{TTL: time.Second, LockTimeout: 10 * time.Second}, run: func(t *testing.T, s store.Store, cfg Config) {
		// Nobody took the expired key over, but it counts as absent: its
		// holder can neither extend, save, record nor release it.
		l := takeLease(t, s, key, fp, longLease)
		cfg.advance(cfg.TTL + 300*time.Millisecond)
		for name, err := range map[string]error{
			"Extend":   l.Extend(t.Context(), longLease),
			"SaveStep": l.SaveStep(t.Context(), store.Step{Name: "late"}),
			"Record":   l.Record(t.Context(), okOutcome("late")),
		} {
			if !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("%s of an expired lease: %v, want ErrLeaseLost", name, err)
			}
		}
		fresh := takeLease(t, s, key, fp, longLease)
		wantSteps(t, fresh)
	}},

	{name: "LeaseWaitsForAtomicOwner", cfg: Config{TTL: time.Hour, LockTimeout: 5 * time.Second}, run: func(t *testing.T, s store.Store, _ Config) {
		for _, tc := range []struct {
			name   string
			finish func(txn store.Txn) error
			check  func(t *testing.T, c store.LeasedClaim)
		}{
			{
				name:   "Record",
				finish: func(txn store.Txn) error { return txn.Record(context.Background(), okOutcome("atomic")) },
				check: func(t *testing.T, c store.LeasedClaim) {
					if c.Entry == nil {
						t.Fatalf("ClaimLeased = %s, want the recorded entry", describeLeasedClaim(c))
					}
					wantRecorded(t, c.Entry, fp, okOutcome("atomic"))
				},
			},
			{
				name:   "Release",
				finish: func(txn store.Txn) error { return txn.Release(context.Background()) },
				check: func(t *testing.T, c store.LeasedClaim) {
					if c.Lease == nil {
						t.Fatalf("Lease = %s, want a Lease", describeLeasedClaim(c))
					}
					wantSteps(t, c.Lease)
				},
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				k := key
				k.Key = tc.name
				txn := claimTxn(t, s, k, fp)
				type result struct {
					c   store.LeasedClaim
					err error
				}
				calling, leased := make(chan struct{}), make(chan result, 1)
				go func() {
					close(calling)
					c, err := s.ClaimLeased(t.Context(), k, store.LeaseRequest{Fingerprint: fp, Lease: longLease})
					leased <- result{c, err}
				}()
				<-calling
				select {
				case r := <-leased:
					// It must wait for the atomic owner, which has not
					// finished, for up to the lock timeout.
					t.Fatalf("Lease of a key held by an atomic claim returned %s, %v before the claim finished", describeLeasedClaim(r.c), r.err)
				default:
				}
				if ferr := tc.finish(txn); ferr != nil {
					t.Fatalf("the atomic owner's %s: %v", tc.name, ferr)
				}
				r := <-leased
				c, err := r.c, r.err
				if err != nil {
					t.Fatalf("Lease of a key held by an atomic claim: %v", err)
				}
				if c.Lease != nil {
					t.Cleanup(func() { _ = c.Lease.Release(context.Background()) })
				}
				tc.check(t, c)
			})
		}
	}},

	{name: "LeaseWaitForAtomicOwnerIsBounded", cfg: Config{TTL: time.Hour, LockTimeout: 300 * time.Millisecond}, run: func(t *testing.T, s store.Store, cfg Config) {
		warm(t, s, 2)
		_ = claimTxn(t, s, key, fp)
		start := time.Now()
		c, err := s.ClaimLeased(t.Context(), key, store.LeaseRequest{Fingerprint: fp, Lease: longLease})
		waited := time.Since(start)
		if !isInUse(err) {
			if c.Lease != nil {
				_ = c.Lease.Release(t.Context())
			}
			t.Fatalf("Lease of a key held by an atomic claim = %s, %v; want ErrInUse", describeLeasedClaim(c), err)
		}
		if waited < cfg.LockTimeout/2 {
			t.Errorf("gave up after %v, want a wait of about the lock timeout %v", waited, cfg.LockTimeout)
		}
	}},

	{name: "EndedContextWritesNothingButRelease", run: func(t *testing.T, s store.Store, _ Config) {
		ended, cancel := context.WithCancel(t.Context())
		cancel()
		for _, withStep := range []bool{false, true} {
			k := key
			k.Key = fmt.Sprintf("with-step-%v", withStep)
			l := takeLease(t, s, k, fp, shortLease)
			var want *store.Step
			if withStep {
				want = &store.Step{Name: "first"}
				if err := l.SaveStep(t.Context(), *want); err != nil {
					t.Fatal(err)
				}
			}
			for name, err := range map[string]error{
				"Extend":   l.Extend(ended, longLease),
				"SaveStep": l.SaveStep(ended, store.Step{Name: "ended"}),
				"Record":   l.Record(ended, okOutcome("ended")),
			} {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("%s with an ended context: %v, want context.Canceled", name, err)
				}
			}
			// Nothing changed: the lease was not extended, and the claim is
			// neither recorded nor released.
			e := leaseEntry(t, s, k, other, longLease)
			wantInProgress(t, e, fp)
			if e.LeaseRemaining > shortLease {
				t.Errorf("LeaseRemaining %v: Extend with an ended context extended the lease", e.LeaseRemaining)
			}
			if want != nil {
				wantSteps(t, l, *want)
			} else {
				wantSteps(t, l)
			}
			// Release works regardless, so that it can be deferred from a
			// request whose caller has gone.
			if err := l.Release(ended); err != nil {
				t.Fatalf("Release with an ended context: %v", err)
			}
			if withStep {
				again := takeLease(t, s, k, fp, longLease) // the lease ended at once
				wantSteps(t, again, *want)
				if err := again.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			} else {
				again := takeLease(t, s, k, other, longLease) // the claim was deleted
				wantSteps(t, again)
			}
		}
	}},

	{name: "InvalidStepIsRefused", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, longLease)
		// At the bounds: saved.
		saved := []store.Step{
			{Name: "charge_sent", Result: bytes.Repeat([]byte{0xff}, store.MaxStepResultBytes)},
			{Name: strings.Repeat("s", store.MaxStepLength)},
			{Name: "étape_✓", Result: []byte("d")},
		}
		for _, p := range saved {
			if err := l.SaveStep(t.Context(), p); err != nil {
				t.Fatalf("SaveStep(%d-byte step, %d bytes of data): %v", len(p.Name), len(p.Result), err)
			}
		}
		// Past them: refused, and nothing is saved.
		for name, p := range map[string]store.Step{
			"empty step":            {Result: []byte("d")},
			"256-byte step":         {Name: strings.Repeat("s", store.MaxStepLength+1)},
			"NUL":                   {Name: "charge\x00sent"},
			"invalid UTF-8":         {Name: "charge\xffsent"},
			"newline":               {Name: "charge\nsent"},
			"DEL":                   {Name: "charge\x7fsent"},
			"data past 64 KiB":      {Name: "charge_sent", Result: make([]byte, store.MaxStepResultBytes+1)},
			"NUL and data too long": {Name: "\x00", Result: make([]byte, store.MaxStepResultBytes+1)},
		} {
			if err := l.SaveStep(t.Context(), p); !errors.Is(err, store.ErrInvalidStep) {
				t.Errorf("SaveStep with %s: %v, want ErrInvalidStep", name, err)
			}
		}
		wantSteps(t, l, saved...)
		// The steps kept are the valid ones: a retry resumes from them.
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		again := takeLease(t, s, key, fp, longLease)
		wantSteps(t, again, saved...)
	}},

	{name: "LeaseIsSafeForConcurrentUse", run: func(t *testing.T, s store.Store, _ Config) {
		l := takeLease(t, s, key, fp, longLease)
		var errs tally
		concurrently(4, func(i int) {
			for j := range 10 {
				var err error
				if i%2 == 0 {
					err = l.Extend(t.Context(), longLease)
				} else {
					err = l.SaveStep(t.Context(), store.Step{Name: "step", Result: []byte{byte(i), byte(j)}})
					_ = l.Steps()
				}
				if err != nil {
					errs.err(err)
				}
			}
		})
		if len(errs.errs) != 0 {
			t.Fatalf("concurrent writes of one holder: %v", errs.errs)
		}
		if err := l.Record(t.Context(), okOutcome("done")); err != nil {
			t.Fatal(err)
		}
	}},
}
