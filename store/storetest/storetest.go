package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/store"
)

// Config is what a case needs from the store it builds: its timing, and the
// clock it tells the time by.
type Config struct {
	// TTL is how long a key is kept before it counts as absent.
	TTL time.Duration
	// LockTimeout bounds how long a claim waits for a concurrent atomic
	// owner of the same key. It is measured in real time.
	LockTimeout time.Duration
	// Now is the clock by which the store must tell the time: when a key
	// expires, when a lease runs out, how long ago it did. It is the
	// case's own, and stands still until the case moves it forward, so
	// that no case sleeps for a key to expire or a lease to run out.
	Now func() time.Time

	clock *clock // moves Now
}

// advance moves the case's clock forward by d.
func (c Config) advance(d time.Duration) { c.clock.advance(d) }

// defaultConfig is the timing of cases that do not wait for expiry or for
// the lock timeout: long enough never to run out during a case.
var defaultConfig = Config{TTL: time.Hour, LockTimeout: 10 * time.Second}

// clockStart is where the clock of every case starts: far from the real
// time, so that a store that reads another clock beside Config.Now fails
// the cases instead of passing them by chance.
var clockStart = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

// clock is the clock of a case: it moves only when the case says so.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Run runs the conformance cases against stores built by newStore, each
// case as a parallel subtest of t with a new, empty store of its own.
// newStore is called from the subtest with that subtest's t, and should
// register any cleanup there.
//
// The cases of the optional interfaces, [store.Finishing], [store.Admin]
// and [store.ReplayCounter] (with Admin, which shows the counts), run exactly when the stores newStore builds implement
// them (as the first one built shows); Run logs each group that does not
// apply.
func Run(t *testing.T, newStore func(t *testing.T, cfg Config) store.Store) {
	t.Helper()
	var (
		mu    sync.Mutex
		first store.Store // the first store built, whose type says which optional groups apply
	)
	build := func(t *testing.T, cfg Config) store.Store {
		s := newStore(t, cfg)
		mu.Lock()
		if first == nil {
			first = s
		}
		mu.Unlock()
		return s
	}
	for _, group := range []struct {
		name  string
		cases []testCase
		// part is the optional interface the cases test; nil for the
		// Store every store implements.
		part *optional
	}{
		{"Claim", claimCases, nil},
		{"Optimistic", optimisticCases, nil},
		{"Lease", leaseCases, nil},
		{"Key", keyCases, nil},
		{"Steps", stepCases, nil},
		{"Finishing", finishingCases, finishingPart},
		{"Admin", adminCases, adminPart},
		{"Audit", auditCases, adminPart},
		{"Bulk", bulkCases, adminPart},
		{"Replays", replayCases, replaysPart},
	} {
		if group.part != nil {
			mu.Lock()
			s := first
			mu.Unlock()
			if s == nil || !group.part.implements(s) {
				t.Logf("the %s cases do not apply: the store (%T) does not implement %s", group.name, s, group.part.name)
				continue
			}
		}
		t.Run(group.name, func(t *testing.T) {
			for _, c := range group.cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					cfg := defaultConfig
					if c.cfg.TTL != 0 {
						cfg.TTL = c.cfg.TTL
					}
					if c.cfg.LockTimeout != 0 {
						cfg.LockTimeout = c.cfg.LockTimeout
					}
					cfg.clock = &clock{now: clockStart}
					cfg.Now = cfg.clock.Now
					s := build(t, cfg)
					c.run(t, s, cfg)
				})
			}
		})
	}
}

// optional is an optional interface of the store contract, which callers
// discover by a type assertion.
type optional struct {
	name       string
	implements func(store.Store) bool
}

var (
	finishingPart = &optional{"store.Finishing", func(s store.Store) bool { _, ok := s.(store.Finishing); return ok }}
	adminPart     = &optional{"store.Admin", func(s store.Store) bool { _, ok := s.(store.Admin); return ok }}
	replaysPart   = &optional{"store.ReplayCounter and store.Admin", func(s store.Store) bool {
		_, counts := s.(store.ReplayCounter)
		_, admin := s.(store.Admin)
		return counts && admin
	}}
)

type testCase struct {
	name string
	cfg  Config // TTL and LockTimeout; zero: defaultConfig's
	run  func(t *testing.T, s store.Store, cfg Config)
}

// The keys and fingerprints of the cases.
var (
	key   = store.Scope{Tenant: "tenant", Method: "/idem.test.v1.Test/Do", Key: "key-1"}
	fp    = []byte("\x01fingerprint-one")
	other = []byte("\x01fingerprint-two")
)

// leaseKey is a key of its own for cases that lease beside an atomic
// claim of key.
var leaseKey = store.Scope{Tenant: "tenant", Method: "/idem.test.v1.Test/Lease", Key: "key-1"}

// wantAbout fails the test unless got is want, to the second: times of
// the case's clock, which a store may keep less precisely.
func wantAbout(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want).Abs(); d >= time.Second {
		t.Errorf("%s is %v, %v from %v", what, got, d, want)
	}
}

// warm holds n claims of keys of their own at once, and releases them,
// before a case with a short lock timeout: a store that opens connections
// as claims need them (and bounds that wait by the lock timeout, as the
// PostgreSQL store does) has them open by then, so that the case's claims
// wait for the key, not for a new connection on a busy machine. A round
// whose claims fail is tried again, while the connections come up.
func warm(t *testing.T, s store.Store, n int) {
	t.Helper()
	const rounds = 20
	var err error
	for range rounds {
		var txns []store.Txn
		for i := range n {
			k := store.Scope{Tenant: key.Tenant, Method: key.Method, Key: fmt.Sprint("warm-", i)}
			var c store.Claim
			if c, err = s.Claim(t.Context(), k, store.ClaimRequest{Fingerprint: fp}); err != nil {
				break
			}
			if c.Txn != nil {
				txns = append(txns, c.Txn)
			}
		}
		for _, txn := range txns {
			_ = txn.Release(context.Background())
		}
		if err == nil {
			return
		}
	}
	t.Fatalf("%d claims of free keys failed %d times in a row, the last with %v", n, rounds, err)
}

// okOutcome returns an OK outcome whose body names what recorded it.
func okOutcome(body string) store.Outcome {
	return store.Outcome{Code: code.Code_OK, Body: []byte(body)}
}

// errorOutcome is a deterministic error, recorded as its google.rpc.Status.
func errorOutcome() store.Outcome {
	body, err := proto.Marshal(&spb.Status{Code: int32(code.Code_INVALID_ARGUMENT), Message: "amount must be positive"})
	if err != nil {
		panic(err)
	}
	return store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: body}
}

// claimTxn claims k and fails the test unless it gets a Txn. The Txn is
// released when the test ends, which does nothing once it has finished.
func claimTxn(t *testing.T, s store.Store, k store.Scope, fingerprint []byte) store.Txn {
	t.Helper()
	c, err := s.Claim(t.Context(), k, store.ClaimRequest{Fingerprint: fingerprint})
	if err != nil {
		t.Fatalf("Claim(%v): %v, want a Txn", k, err)
	}
	if c.Txn == nil || c.Entry != nil {
		t.Fatalf("Claim(%v) = %s, want a Txn", k, describeClaim(c))
	}
	t.Cleanup(func() { _ = c.Txn.Release(context.Background()) })
	return c.Txn
}

// claimEntry claims k and fails the test unless it gets an Entry.
func claimEntry(t *testing.T, s store.Store, k store.Scope, fingerprint []byte) *store.Entry {
	t.Helper()
	c, err := s.Claim(t.Context(), k, store.ClaimRequest{Fingerprint: fingerprint})
	if err != nil {
		t.Fatalf("Claim(%v): %v, want an Entry", k, err)
	}
	if c.Entry == nil || c.Txn != nil {
		if c.Txn != nil {
			_ = c.Txn.Release(context.Background())
		}
		t.Fatalf("Claim(%v) = %s, want an Entry", k, describeClaim(c))
	}
	return c.Entry
}

// takeLease leases k and fails the test unless it gets a Lease. The Lease is
// released when the test ends, which does nothing once it has finished.
func takeLease(t *testing.T, s store.Store, k store.Scope, fingerprint []byte, d time.Duration) store.Lease {
	t.Helper()
	return takeLeasedClaim(t, s, k, fingerprint, d).Lease
}

// takeLeasedClaim is takeLease, returning the whole claim.
func takeLeasedClaim(t *testing.T, s store.Store, k store.Scope, fingerprint []byte, d time.Duration) store.LeasedClaim {
	t.Helper()
	c, err := s.ClaimLeased(t.Context(), k, store.LeaseRequest{Fingerprint: fingerprint, Lease: d})
	if err != nil {
		t.Fatalf("Lease(%v): %v, want a Lease", k, err)
	}
	if c.Lease == nil || c.Entry != nil {
		t.Fatalf("Lease(%v) = %s, want a Lease", k, describeLeasedClaim(c))
	}
	t.Cleanup(func() { _ = c.Lease.Release(context.Background()) })
	return c
}

// leaseEntry leases k and fails the test unless it gets an Entry.
func leaseEntry(t *testing.T, s store.Store, k store.Scope, fingerprint []byte, d time.Duration) *store.Entry {
	t.Helper()
	c, err := s.ClaimLeased(t.Context(), k, store.LeaseRequest{Fingerprint: fingerprint, Lease: d})
	if err != nil {
		t.Fatalf("Lease(%v): %v, want an Entry", k, err)
	}
	if c.Entry == nil || c.Lease != nil {
		if c.Lease != nil {
			_ = c.Lease.Release(context.Background())
		}
		t.Fatalf("Lease(%v) = %s, want an Entry", k, describeLeasedClaim(c))
	}
	return c.Entry
}

// wantRecorded fails the test unless e is a recorded entry of a request
// with fingerprint whose outcome is out.
func wantRecorded(t *testing.T, e *store.Entry, fingerprint []byte, out store.Outcome) {
	t.Helper()
	if e.State != store.Recorded {
		t.Fatalf("entry %s, want recorded", describeEntry(e))
	}
	if !bytes.Equal(e.Fingerprint, fingerprint) {
		t.Errorf("entry fingerprint %q, want %q", e.Fingerprint, fingerprint)
	}
	if e.Outcome.Code != out.Code || !bytes.Equal(e.Outcome.Body, out.Body) || e.Outcome.NotCached != out.NotCached {
		t.Errorf("entry outcome %+v, want %+v", e.Outcome, out)
	}
	if e.LeaseRemaining != 0 {
		t.Errorf("recorded entry has LeaseRemaining %v, want 0", e.LeaseRemaining)
	}
}

// wantInProgress fails the test unless e is an in-progress entry of a
// request with fingerprint.
func wantInProgress(t *testing.T, e *store.Entry, fingerprint []byte) {
	t.Helper()
	if e.State != store.InProgress {
		t.Fatalf("entry %s, want in progress", describeEntry(e))
	}
	if !bytes.Equal(e.Fingerprint, fingerprint) {
		t.Errorf("entry fingerprint %q, want %q", e.Fingerprint, fingerprint)
	}
}

// wantSteps fails the test unless l's steps are want, in order.
func wantSteps(t *testing.T, l store.Lease, want ...store.Step) {
	t.Helper()
	got := l.Steps()
	if !slices.EqualFunc(got, want, func(a, b store.Step) bool {
		return a.Name == b.Name && bytes.Equal(a.Result, b.Result)
	}) {
		t.Errorf("Steps() = %s, want %s", describeSteps(got), describeSteps(want))
	}
}

// describeSteps shows steps with at most the first 32 bytes of each name
// and result.
func describeSteps(steps []store.Step) string {
	out := make([]string, len(steps))
	for i, p := range steps {
		step, data := p.Name, p.Result
		if len(step) > 32 {
			step = step[:32] + "..."
		}
		if len(data) > 32 {
			data = append(data[:32:32], "..."...)
		}
		out[i] = fmt.Sprintf("{Step: %q (%d bytes), Data: %q (%d bytes)}", step, len(p.Name), data, len(p.Result))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

func describeEntry(e *store.Entry) string {
	if e == nil {
		return "<nil>"
	}
	state := fmt.Sprintf("state %q", e.State)
	switch e.State {
	case store.Recorded:
		state = "recorded"
	case store.InProgress:
		state = "in progress"
	}
	return fmt.Sprintf("{%s, fingerprint %q, outcome %+v, lease remaining %v}", state, e.Fingerprint, e.Outcome, e.LeaseRemaining)
}

func describeClaim(c store.Claim) string {
	return fmt.Sprintf("{Txn: %v, Entry: %s}", c.Txn != nil, describeEntry(c.Entry))
}

func describeLeasedClaim(c store.LeasedClaim) string {
	return fmt.Sprintf("{Lease: %v, Entry: %s, TookOver: %v}", c.Lease != nil, describeEntry(c.Entry), c.TookOver)
}

// concurrently runs f n times at once, each with its index, and waits for
// all of them. The calls are released together, after all have started.
func concurrently(n int, f func(i int)) {
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range n {
		done.Go(func() {
			start.Wait()
			f(i)
		})
	}
	start.Done()
	done.Wait()
}

// tally counts the results of concurrent claims.
type tally struct {
	mu      sync.Mutex
	owners  int
	entries []*store.Entry
	errs    []error
}

func (r *tally) owner() {
	r.mu.Lock()
	r.owners++
	r.mu.Unlock()
}

func (r *tally) entry(e *store.Entry) {
	r.mu.Lock()
	r.entries = append(r.entries, e)
	r.mu.Unlock()
}

func (r *tally) err(err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

// isInUse reports whether err is store.ErrInUse.
func isInUse(err error) bool { return errors.Is(err, store.ErrInUse) }
