package memory

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/store"
)

var _ store.Admin = (*Store)(nil)

// The bounds of a page of [Store.Keys] and [Store.AuditLog].
const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// pageSize returns the entries a page of a filter's limit holds: the
// default for none, at most the maximum.
func pageSize(limit int) int {
	switch {
	case limit <= 0:
		return defaultPageSize
	case limit > maxPageSize:
		return maxPageSize
	}
	return limit
}

// state returns the state of e at now, as an operator sees it.
func (e *entry) state(now time.Time) store.State {
	switch {
	case e.expired(now):
		return store.Expired
	case e.recorded:
		return store.Recorded
	case now.Before(e.lockedUntil):
		return store.InProgress
	}
	return store.Abandoned
}

// info returns everything e keeps of k, at now.
func (e *entry) info(k store.Scope, now time.Time) store.KeyInfo {
	ki := store.KeyInfo{
		Scope:       k,
		State:       e.state(now),
		Fingerprint: bytes.Clone(e.fp),
		CreatedAt:   e.createdAt,
		UpdatedAt:   e.updatedAt,
		ExpiresAt:   e.expiresAt,
		Takeovers:   e.takeovers,
		Call:        cloneCall(e.call),
		Replays:     e.replays,
		LastReplay:  e.lastReplay,
	}
	if len(e.steps) > 0 {
		ki.Steps = cloneSteps(e.steps)
	}
	if e.recorded {
		out := cloneOutcome(e.out)
		ki.Outcome = &out
	} else {
		ki.LeaseUntil = e.lockedUntil
	}
	return ki
}

// visibleLocked returns the entry of k that an operator sees: none while
// an atomic claim of k runs, whose entry, like an uncommitted row, no one
// else sees. The caller holds s.mu.
func (s *Store) visibleLocked(k store.Scope) *entry {
	e := s.entries[k]
	if e == nil || e.pending {
		return nil
	}
	return e
}

// Key implements [store.Admin]. An atomic claim still running has no entry
// to see yet.
func (s *Store) Key(ctx context.Context, k store.Scope) (store.KeyInfo, error) {
	if err := k.Validate(); err != nil {
		return store.KeyInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.KeyInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.visibleLocked(k)
	if e == nil {
		return store.KeyInfo{}, store.ErrNotFound
	}
	return e.info(k, s.now()), nil
}

// cursor is the position of the last entry of a page: its creation, then
// its key. The cursor's text is its JSON, base64-encoded.
type cursor struct {
	At  int64       `json:"at"` // Unix nanoseconds
	Key store.Scope `json:"key"`
}

func (c cursor) compare(d cursor) int {
	return cmp.Or(cmp.Compare(c.At, d.At),
		strings.Compare(c.Key.Tenant, d.Key.Tenant),
		strings.Compare(c.Key.Method, d.Key.Method),
		strings.Compare(c.Key.Key, d.Key.Key))
}

func (c cursor) encode() string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // a struct of strings and an int
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return c, store.ErrInvalidCursor
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || dec.More() {
		return c, store.ErrInvalidCursor
	}
	if err := c.Key.Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", store.ErrInvalidCursor, err)
	}
	return c, nil
}

// Keys implements [store.Admin]: it orders the entries by their creation
// (by [WithClock]), then by tenant, method and key. Like the PostgreSQL
// store, it refuses a filter that fails [store.KeyFilter.Validate].
func (s *Store) Keys(ctx context.Context, f store.KeyFilter) ([]store.KeyInfo, string, error) {
	if err := f.Validate(); err != nil {
		return nil, "", err
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	limit := pageSize(f.Limit)
	var from *cursor
	if f.After != "" {
		c, err := decodeCursor(f.After)
		if err != nil {
			return nil, "", err
		}
		from = &c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	type found struct {
		pos  cursor
		info store.KeyInfo
	}
	var all []found
	for k, e := range s.entries {
		pos := cursor{At: e.createdAt.UnixNano(), Key: k}
		switch {
		case e.pending,
			!f.AllTenants && k.Tenant != f.Tenant,
			f.Method != "" && k.Method != f.Method,
			!f.CreatedAfter.IsZero() && e.createdAt.Before(f.CreatedAfter),
			!f.CreatedBefore.IsZero() && !e.createdAt.Before(f.CreatedBefore),
			len(f.States) > 0 && !slices.Contains(f.States, e.state(now)),
			from != nil && pos.compare(*from) <= 0:
			continue
		}
		all = append(all, found{pos: pos, info: e.info(k, now)})
	}
	slices.SortFunc(all, func(a, b found) int { return a.pos.compare(b.pos) })
	next := ""
	if len(all) > limit {
		all = all[:limit]
		next = all[limit-1].pos.encode()
	}
	out := make([]store.KeyInfo, len(all))
	for i, f := range all {
		out[i] = f.info
	}
	return out, next, nil
}

// Forget implements [store.Admin]. A forced Forget fences the lease's
// holder: its later writes fail with store.ErrLeaseLost, also once the
// key is claimed again, whose lease has a token of its own.
func (s *Store) Forget(ctx context.Context, k store.Scope, o store.ForgetOptions) error {
	if err := k.Validate(); err != nil {
		return err
	}
	audit, err := auditOf(o.Audit, k, store.ActionForget, o.Force)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.visibleLocked(k)
	if e == nil {
		return store.ErrNotFound
	}
	now := s.now()
	before := e.state(now)
	if !o.Force && before == store.InProgress {
		return &store.LeaseLiveError{Until: e.lockedUntil}
	}
	delete(s.entries, k)
	if audit != nil {
		audit.Before = before
		s.addAuditLocked(*audit, now)
	}
	return nil
}

// Settle implements [store.Admin]. It ends the lease, so that its holder
// is fenced (its later writes fail with store.ErrLeaseLost), and drops the
// steps and the request kept for a finisher; it keeps the expiry. An
// expired entry counts as none: Settle fails with store.ErrNotFound.
func (s *Store) Settle(ctx context.Context, k store.Scope, st *spb.Status, o store.SettleOptions) error {
	if err := k.Validate(); err != nil {
		return err
	}
	out, err := store.SettleOutcome(st)
	if err != nil {
		return err
	}
	audit, err := auditOf(o.Audit, k, store.ActionSettle, o.Force)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.visibleLocked(k)
	if e == nil {
		return store.ErrNotFound
	}
	now := s.now()
	before := e.state(now)
	switch before {
	case store.Expired:
		return fmt.Errorf("%w: the key's entry expired", store.ErrNotFound)
	case store.Recorded:
		return store.ErrNotInProgress
	case store.InProgress:
		if !o.Force {
			return &store.LeaseLiveError{Until: e.lockedUntil}
		}
	}
	e.recorded = true
	e.out = out
	e.token = 0 // no lease has it
	e.lockedUntil = time.Time{}
	e.steps, e.call = nil, nil
	e.updatedAt = now
	if audit != nil {
		audit.Before, audit.After = before, store.Recorded
		s.addAuditLocked(*audit, now)
	}
	return nil
}
