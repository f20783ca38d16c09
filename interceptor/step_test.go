package interceptor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// stallStore is a store whose first lease can be made to stall, as a worker
// whose process stops (a long pause, a frozen machine) stops extending its
// lease: while stalled, its Extend fails as a network failure would, and the
// lease runs out.
type stallStore struct {
	store.Store
	mu    sync.Mutex
	first *stallLease
}

func (s *stallStore) ClaimLeased(ctx context.Context, key store.Scope, r store.LeaseRequest) (store.LeasedClaim, error) {
	c, err := s.Store.ClaimLeased(ctx, key, r)
	if c.Lease != nil {
		s.mu.Lock()
		if s.first == nil {
			s.first = &stallLease{Lease: c.Lease}
			c.Lease = s.first
		}
		s.mu.Unlock()
	}
	return c, err
}

// stall makes the first lease's Extend fail, or work again.
func (s *stallStore) stall(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.first.stalled.Store(on)
}

type stallLease struct {
	store.Lease
	stalled atomic.Bool
}

func (l *stallLease) Extend(ctx context.Context, d time.Duration) error {
	if l.stalled.Load() {
		return errors.New("write tcp 10.0.0.1:5432: i/o timeout")
	}
	return l.Lease.Extend(ctx, d)
}

// steps counts the runs of each step's function: its side effect.
type steps struct {
	mu   sync.Mutex
	runs map[string]int
}

// step runs the step name through idem.Step, counting fn's runs.
func (s *steps) step(ctx context.Context, name string) error {
	_, err := idem.Step(ctx, name, func(context.Context) ([]byte, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.runs == nil {
			s.runs = map[string]int{}
		}
		s.runs[name]++
		return []byte(name + " done"), nil
	})
	return err
}

func (s *steps) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[name]
}

// TestStepNotRunAfterLeaseLost: worker A saves step s1 and stalls; its lease
// runs out, and B takes the call over, runs s2 and finishes. A's heartbeat
// then finds the lease lost and ends A's context: A's next step is refused
// with store.ErrLeaseLost, and its function is not run a second time.
func TestStepNotRunAfterLeaseLost(t *testing.T) {
	const lease = 300 * time.Millisecond
	for _, st := range leaseStores {
		t.Run(st.name, func(t *testing.T) {
			stalling := &stallStore{}
			e := newEnv(t, setup{
				store: func(pool *pgxpool.Pool) store.Store { stalling.Store = st.new(pool); return stalling },
				opts:  []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: lease})},
			})
			var (
				s        steps
				calls    atomic.Int32
				saved    = make(chan struct{})
				fenced   = make(chan error, 1)
				answered = make(chan error, 1)
			)
			e.svc.setHook(func(ctx context.Context, _ string) error {
				a := calls.Add(1) == 1
				if err := s.step(ctx, "s1"); err != nil {
					return err
				}
				if a {
					close(saved)
					<-ctx.Done() // A stalls until its heartbeat finds the lease lost
				}
				err := s.step(ctx, "s2")
				if a {
					fenced <- err
				}
				return err
			})
			go func() { answered <- callErr(e, "k") }()
			<-saved
			stalling.stall(true)
			// B retries until A's lease has run out, takes the call over
			// and finishes it.
			if _, _, err := settle(t, e, "k"); err != nil {
				t.Fatalf("the takeover: %v", err)
			}
			stalling.stall(false) // A's heartbeat beats again

			if err := <-answered; reason(err) != idem.ReasonLeaseLost {
				t.Errorf("A's answer: %v, want %s", err, idem.ReasonLeaseLost)
			}
			if err := <-fenced; !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("A's Step(s2): %v, want store.ErrLeaseLost", err)
			}
			if n := s.count("s2"); n != 1 {
				t.Errorf("s2 ran %d times, want 1 (by B only)", n)
			}
			if n := s.count("s1"); n != 1 {
				t.Errorf("s1 ran %d times, want 1", n)
			}
			if _, header, err := settle(t, e, "k"); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
				t.Errorf("retry after both: %v (header %v), want B's answer replayed", err, header)
			}
		})
	}
}

// testClock is a clock for store/memory that a test moves forward.
type testClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}

// TestStepChecksTheLeaseBeforeRunning: as TestStepNotRunAfterLeaseLost, but
// A's heartbeat has not beaten since B took over (its lease is long, and
// ran out by the store's clock), so A's context is still live when it
// reaches s2: Step asks the store whether the lease is still A's before it
// runs s2, and refuses.
func TestStepChecksTheLeaseBeforeRunning(t *testing.T) {
	const lease = 10 * time.Minute // the heartbeat beats every 200 s: not in this test
	for _, mem := range []bool{false, true} {
		name := "postgres"
		if mem {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) {
			clock := &testClock{}
			e := newEnv(t, setup{
				memory:      mem,
				memoryStore: memory.New(memory.WithClock(clock.now)),
				opts:        []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: lease})},
			})
			// runOut ends A's lease, by the store's clock.
			runOut := func() {
				if mem {
					clock.advance(2 * lease)
					return
				}
				if _, err := e.pool.Exec(t.Context(), `UPDATE idempotency_keys SET locked_until = now()`); err != nil {
					t.Fatal(err)
				}
			}
			var (
				s        steps
				calls    atomic.Int32
				saved    = make(chan struct{})
				resume   = make(chan struct{})
				fenced   = make(chan error, 1)
				live     = make(chan error, 1)
				answered = make(chan error, 1)
			)
			e.svc.setHook(func(ctx context.Context, _ string) error {
				a := calls.Add(1) == 1
				if err := s.step(ctx, "s1"); err != nil {
					return err
				}
				if a {
					close(saved)
					<-resume
					live <- context.Cause(ctx)
				}
				err := s.step(ctx, "s2")
				if a {
					fenced <- err
				}
				return err
			})
			go func() { answered <- callErr(e, "k") }()
			<-saved
			runOut()
			if err := callErr(e, "k"); err != nil {
				t.Fatalf("B's takeover: %v", err)
			}
			close(resume)

			if err := <-live; err != nil {
				t.Fatalf("A's context ended (%v) before its step: the case needs a live one", err)
			}
			if err := <-fenced; !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("A's Step(s2): %v, want store.ErrLeaseLost", err)
			}
			if err := <-answered; reason(err) != idem.ReasonLeaseLost {
				t.Errorf("A's answer: %v, want %s", err, idem.ReasonLeaseLost)
			}
			if n := s.count("s2"); n != 1 {
				t.Errorf("s2 ran %d times, want 1 (by B only)", n)
			}
			if err := callErr(e, "k"); err != nil {
				t.Errorf("retry after both: %v, want B's answer", err)
			}
			if n := e.svc.count(); n != 2 {
				t.Errorf("%d executions, want A's and B's", n)
			}
		})
	}
}
