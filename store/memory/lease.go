package memory

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/internal/stepset"
)

// ClaimLeased implements [store.Store]. Like [Store.Claim], it refuses a key that
// breaks the rules of [store.Scope.Validate], and it waits for a
// running atomic claim of the key to finish, for at most the lock timeout.
// A takeover keeps the key's expiry and its steps; a key that expired is
// leased afresh, without them.
func (s *Store) ClaimLeased(ctx context.Context, key store.Scope, r store.LeaseRequest) (store.LeasedClaim, error) {
	if err := key.Validate(); err != nil {
		return store.LeasedClaim{}, err
	}
	e, now, err := s.lockSettled(ctx, key)
	if err != nil {
		return store.LeasedClaim{}, err
	}
	defer s.mu.Unlock()
	switch {
	case e == nil || e.expired(now):
		s.tokens++
		e = &entry{
			fp:          bytes.Clone(r.Fingerprint),
			expiresAt:   now.Add(s.ttlOf(r.TTL)),
			createdAt:   now,
			updatedAt:   now,
			token:       s.tokens,
			lockedUntil: now.Add(r.Lease),
			call:        cloneCall(r.Call),
		}
		s.entries[key] = e
		return store.LeasedClaim{Lease: &leased{store: s, key: key, token: s.tokens}, ExpiresAt: e.expiresAt}, nil
	case !e.recorded && !now.Before(e.lockedUntil) && bytes.Equal(e.fp, r.Fingerprint):
		s.tokens++
		e.token = s.tokens
		e.lockedUntil = now.Add(r.Lease)
		e.takeovers++
		e.updatedAt = now
		if r.Call != nil {
			e.call = cloneCall(r.Call)
		}
		l := &leased{store: s, key: key, token: s.tokens, steps: cloneSteps(e.steps)}
		return store.LeasedClaim{Lease: l, ExpiresAt: e.expiresAt, TookOver: true}, nil
	}
	return store.LeasedClaim{Entry: e.snapshot(now)}, nil
}

func cloneSteps(steps []store.Step) []store.Step {
	out := make([]store.Step, len(steps))
	for i, p := range steps {
		out[i] = store.Step{Name: p.Name, Result: bytes.Clone(p.Result)}
	}
	return out
}

func cloneCall(c *store.Call) *store.Call {
	if c == nil {
		return nil
	}
	md := make(map[string][]string, len(c.Metadata))
	for k, v := range c.Metadata {
		md[k] = append([]string(nil), v...)
	}
	return &store.Call{Method: c.Method, Request: bytes.Clone(c.Request), Metadata: md}
}

func cloneStep(p *store.Step) *store.Step {
	if p == nil {
		return nil
	}
	return &store.Step{Name: p.Name, Result: bytes.Clone(p.Result)}
}

// leased is a held leased claim.
type leased struct {
	store *Store
	key   store.Scope
	token uint64

	mu       sync.Mutex
	steps    []store.Step
	finished bool // Record or Release was called; guarded by mu

	// ended is set once Record or Release took effect: the lease is no
	// longer its holder's to write under, even where its entry is still
	// there with its token (released with saved steps). Guarded by
	// store.mu.
	ended bool
}

// heldLocked returns the key's entry while it is still this lease's: not
// ended, same token, not recorded and not expired. The caller holds
// store.mu.
func (l *leased) heldLocked() (*entry, time.Time, error) {
	now := l.store.now()
	e := l.store.entries[l.key]
	if l.ended || e == nil || e.token != l.token || e.recorded || e.expired(now) {
		return nil, now, store.ErrLeaseLost
	}
	return e, now, nil
}

func (l *leased) Steps() []store.Step {
	l.mu.Lock()
	defer l.mu.Unlock()
	return cloneSteps(l.steps)
}

func (l *leased) SaveStep(ctx context.Context, p store.Step) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.store
	s.mu.Lock()
	defer s.mu.Unlock()
	e, now, err := l.heldLocked()
	if err != nil {
		return err
	}
	steps, err := stepset.Merge(e.steps, *cloneStep(&p))
	if err != nil {
		return err
	}
	e.steps, e.updatedAt = steps, now
	l.steps = cloneSteps(steps)
	return nil
}

func (l *leased) Extend(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s := l.store
	s.mu.Lock()
	defer s.mu.Unlock()
	e, now, err := l.heldLocked()
	if err != nil {
		return err
	}
	e.lockedUntil = now.Add(d)
	return nil
}

func (l *leased) Record(ctx context.Context, out store.Outcome) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.finished = true
	s := l.store
	s.mu.Lock()
	defer s.mu.Unlock()
	e, now, err := l.heldLocked()
	if err != nil {
		return err // a second Record too: the first ended the lease
	}
	l.ended = true
	e.updatedAt = now
	e.recorded = true
	e.out = cloneOutcome(out)
	e.lockedUntil = time.Time{}
	e.call = nil // the request is not kept past its outcome
	return nil
}

// Abandoned implements [store.Finishing].
func (s *Store) Abandoned(ctx context.Context, grace time.Duration, limit int) ([]store.AbandonedCall, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []store.AbandonedCall
	for k, e := range s.entries {
		if len(out) >= limit {
			break
		}
		if e.call == nil || e.recorded || e.pending || e.expired(now) {
			continue
		}
		wait := grace << min(e.takeovers, 16)
		if now.Before(e.lockedUntil.Add(wait)) {
			continue
		}
		out = append(out, store.AbandonedCall{
			Scope:       k,
			Fingerprint: bytes.Clone(e.fp),
			Call:        *cloneCall(e.call),
			Takeovers:   e.takeovers,
		})
	}
	return out, nil
}

// Release ignores ctx: it works after the request's context has ended.
func (l *leased) Release(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return nil
	}
	l.finished = true
	s := l.store
	s.mu.Lock()
	defer s.mu.Unlock()
	e, now, err := l.heldLocked()
	if err != nil {
		return err
	}
	l.ended = true
	if len(e.steps) > 0 || e.call != nil {
		// Keep the steps, or the request kept for a finisher: end the
		// lease, so a retry or a finisher takes over (and skips the steps
		// saved).
		e.lockedUntil = now
		e.updatedAt = now
		return nil
	}
	delete(s.entries, l.key)
	return nil
}
