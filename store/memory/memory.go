package memory

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem/store"
)

// Store keeps idempotency keys in a map of this process. It is safe for
// concurrent use. The zero value is not usable; call [New].
type Store struct {
	ttl         time.Duration
	lockTimeout time.Duration
	now         func() time.Time
	retention   time.Duration // of the audit trail

	mu        sync.Mutex
	entries   map[store.Scope]*entry
	audit     []auditRecord // oldest first
	auditSeq  uint64        // the last auditRecord.seq issued
	tokens    uint64        // the last fencing token issued, by any key
	lastSweep time.Time     // by s.now
}

var (
	_ store.Store         = (*Store)(nil)
	_ store.Finishing     = (*Store)(nil)
	_ store.ReplayCounter = (*Store)(nil)
)

// New returns an empty Store.
func New(opts ...Option) *Store {
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	return &Store{
		ttl:         o.ttl,
		lockTimeout: o.lockTimeout,
		now:         o.now,
		retention:   o.audit,
		entries:     make(map[store.Scope]*entry),
	}
}

// entry is the state of one key. All fields are guarded by Store.mu.
type entry struct {
	fp        []byte
	expiresAt time.Time
	// createdAt is when the key was claimed (afresh: a takeover keeps it),
	// updatedAt when its entry last changed, by Store.now.
	createdAt, updatedAt time.Time

	// pending is set while an atomic claim owns the key and has neither
	// recorded nor released it; done is closed when it does.
	pending bool
	done    chan struct{}

	recorded bool
	out      store.Outcome

	// Leased claims only: the fencing token of the current holder (unique
	// in the Store, never reused) and the end of its lease.
	token       uint64
	lockedUntil time.Time
	// steps are every step saved under the key; call is what a finisher
	// needs, kept while the call is in progress; takeovers counts the
	// lease's takeovers.
	steps     []store.Step
	call      *store.Call
	takeovers int

	// replays counts the replays of the recorded outcome, the last at
	// lastReplay.
	replays    int64
	lastReplay time.Time
}

// expired reports whether e counts as absent at now. An entry whose atomic
// claim is still running never does: like an uncommitted row, it is taken
// over only once its owner has finished.
func (e *entry) expired(now time.Time) bool {
	return !e.pending && !now.Before(e.expiresAt)
}

// snapshot returns what a claim that found e reports.
func (e *entry) snapshot(now time.Time) *store.Entry {
	se := &store.Entry{
		State:       store.InProgress,
		Fingerprint: bytes.Clone(e.fp),
		ExpiresAt:   e.expiresAt,
	}
	if e.recorded {
		se.State = store.Recorded
		se.Outcome = cloneOutcome(e.out)
	} else if now.Before(e.lockedUntil) {
		se.LeaseRemaining = e.lockedUntil.Sub(now)
	}
	return se
}

func cloneOutcome(out store.Outcome) store.Outcome {
	out.Body = bytes.Clone(out.Body)
	return out
}

// ttlOf is how long an entry claimed with ttl is kept.
func (s *Store) ttlOf(ttl time.Duration) time.Duration {
	if ttl > 0 {
		return ttl
	}
	return s.ttl
}

// sweepLocked deletes every expired entry, at most once per TTL, so that
// keys nobody claims again do not stay forever.
func (s *Store) sweepLocked(now time.Time) {
	if now.Sub(s.lastSweep) < s.ttl {
		return
	}
	s.lastSweep = now
	for k, e := range s.entries {
		if e.expired(now) {
			delete(s.entries, k)
		}
	}
	s.sweepAuditLocked(now)
}

// Claim implements [store.Store]. A key that breaks the rules of
// [store.Scope.Validate] fails with [store.ErrInvalidScope], as in every store,
// although a map could hold it. A claim of a key whose atomic owner is
// still running waits for the owner to finish, for at most the lock timeout
// ([WithLockTimeout]) or until ctx ends.
func (s *Store) Claim(ctx context.Context, key store.Scope, r store.ClaimRequest) (store.Claim, error) {
	if err := key.Validate(); err != nil {
		return store.Claim{}, err
	}
	e, now, err := s.lockSettled(ctx, key)
	if err != nil {
		return store.Claim{}, err
	}
	defer s.mu.Unlock()
	if e != nil && !e.expired(now) {
		return store.Claim{Entry: e.snapshot(now)}, nil
	}
	e = &entry{
		fp:        bytes.Clone(r.Fingerprint),
		expiresAt: now.Add(s.ttlOf(r.TTL)),
		createdAt: now,
		updatedAt: now,
		pending:   true,
		done:      make(chan struct{}),
	}
	s.entries[key] = e
	return store.Claim{Txn: &txn{store: s, key: key, e: e}, ExpiresAt: e.expiresAt}, nil
}

// lockSettled locks s and returns the entry of key (nil if none) once no
// atomic claim is running on it, waiting for a running one to finish for at
// most the lock timeout, or until ctx ends. On success s.mu stays locked.
func (s *Store) lockSettled(ctx context.Context, key store.Scope) (*entry, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, err
	}
	var w waiter
	defer w.stop()
	s.mu.Lock()
	for {
		now := s.now()
		s.sweepLocked(now)
		e := s.entries[key]
		if e == nil || !e.pending {
			return e, now, nil
		}
		done := e.done
		s.mu.Unlock()
		if err := w.wait(ctx, done, s.lockTimeout); err != nil {
			return nil, now, err
		}
		s.mu.Lock()
	}
}

// waiter bounds the waits of one call by a single lock timeout.
type waiter struct {
	timer *time.Timer
}

func (w *waiter) wait(ctx context.Context, done <-chan struct{}, timeout time.Duration) error {
	if w.timer == nil {
		if timeout <= 0 {
			return store.ErrInUse
		}
		w.timer = time.NewTimer(timeout)
	}
	select {
	case <-done:
		return nil
	case <-w.timer.C:
		return store.ErrInUse
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *waiter) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
}

var errFinished = errors.New("memory: claim already finished")

// txn is an owned atomic claim.
type txn struct {
	store    *Store
	key      store.Scope
	e        *entry
	finished bool // guarded by store.mu
}

// Context returns parent: there is no transaction to join.
func (t *txn) Context(parent context.Context) context.Context { return parent }

func (t *txn) Record(_ context.Context, out store.Outcome) error {
	s := t.store
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.finished {
		return errFinished
	}
	t.finished = true
	t.e.pending = false
	t.e.recorded = true
	t.e.out = cloneOutcome(out)
	t.e.updatedAt = s.now()
	close(t.e.done)
	return nil
}

func (t *txn) Release(context.Context) error {
	s := t.store
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.finished {
		return nil
	}
	t.finished = true
	if s.entries[t.key] == t.e {
		delete(s.entries, t.key)
	}
	close(t.e.done)
	return nil
}

// CountReplay implements [store.ReplayCounter]: it counts the replay in
// the entry at once, by the store's clock, under the store's lock (no
// I/O). An entry that is not recorded, or has expired, or is gone, is not
// counted.
func (s *Store) CountReplay(k store.Scope) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if e := s.entries[k]; e != nil && e.recorded && !e.expired(now) {
		e.replays++
		e.lastReplay = now
	}
}

// FlushReplays implements [store.ReplayCounter]: CountReplay keeps nothing
// to write, so it returns nil at once.
func (s *Store) FlushReplays(context.Context) error { return nil }
