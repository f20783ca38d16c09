package memory

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/store"
)

// Lease implements [store.Store]. Like [Store.Claim], it refuses a key that
// breaks the rules of [store.Key.Validate], and it waits for a
// running atomic claim of the key to finish, for at most the lock timeout.
// A takeover keeps the key's expiry and its last recovery point; a key that
// expired is leased afresh, without one.
func (s *Store) Lease(ctx context.Context, key store.Key, r store.Request, lease time.Duration) (store.LeaseClaim, error) {
	if err := key.Validate(); err != nil {
		return store.LeaseClaim{}, err
	}
	e, now, err := s.lockSettled(ctx, key)
	if err != nil {
		return store.LeaseClaim{}, err
	}
	defer s.mu.Unlock()
	switch {
	case e == nil || e.expired(now):
		s.tokens++
		e = &entry{
			fp:          bytes.Clone(r.Fingerprint),
			expiresAt:   now.Add(s.ttlOf(r)),
			token:       s.tokens,
			lockedUntil: now.Add(lease),
		}
		s.entries[key] = e
		return store.LeaseClaim{Lease: &leased{store: s, key: key, token: s.tokens}, ExpiresAt: e.expiresAt}, nil
	case !e.completed && !now.Before(e.lockedUntil) && bytes.Equal(e.fp, r.Fingerprint):
		s.tokens++
		e.token = s.tokens
		e.lockedUntil = now.Add(lease)
		return store.LeaseClaim{Lease: &leased{store: s, key: key, token: s.tokens, point: clonePoint(e.point)}, ExpiresAt: e.expiresAt}, nil
	}
	return store.LeaseClaim{Entry: e.snapshot(now)}, nil
}

func clonePoint(p *store.RecoveryPoint) *store.RecoveryPoint {
	if p == nil {
		return nil
	}
	return &store.RecoveryPoint{Step: p.Step, Data: bytes.Clone(p.Data)}
}

// leased is a held leased claim.
type leased struct {
	store *Store
	key   store.Key
	token uint64

	mu       sync.Mutex
	point    *store.RecoveryPoint
	finished bool
}

// heldLocked returns the key's entry while it is still this lease's: same
// token, not completed and not expired. The caller holds store.mu.
func (l *leased) heldLocked() (*entry, time.Time, error) {
	now := l.store.now()
	e := l.store.entries[l.key]
	if e == nil || e.token != l.token || e.completed || e.expired(now) {
		return nil, now, store.ErrLeaseLost
	}
	return e, now, nil
}

func (l *leased) RecoveryPoint() (store.RecoveryPoint, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.point == nil {
		return store.RecoveryPoint{}, false
	}
	return *clonePoint(l.point), true
}

func (l *leased) SaveRecoveryPoint(ctx context.Context, p store.RecoveryPoint) error {
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
	e, _, err := l.heldLocked()
	if err != nil {
		return err
	}
	e.point = clonePoint(&p)
	l.point = clonePoint(&p)
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

func (l *leased) Complete(ctx context.Context, out store.Outcome) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return errFinished
	}
	l.finished = true
	s := l.store
	s.mu.Lock()
	defer s.mu.Unlock()
	e, _, err := l.heldLocked()
	if err != nil {
		return err
	}
	e.completed = true
	e.out = cloneOutcome(out)
	e.lockedUntil = time.Time{}
	return nil
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
	if e.point != nil {
		// Keep the progress: end the lease, so a retry takes over and
		// resumes from the recovery point.
		e.lockedUntil = now
		return nil
	}
	delete(s.entries, l.key)
	return nil
}
