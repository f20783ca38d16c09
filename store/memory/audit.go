package memory

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"slices"
	"time"

	"github.com/idemkit/idem/store"
)

// auditRecord is an entry of the audit trail, as the Store keeps it: seq
// orders the entries of one time.
type auditRecord struct {
	seq       uint64
	entry     store.AuditEntry
	expiresAt time.Time
}

// auditOf returns a copy of a, the audit entry of an action on k, with the
// fields the action sets, checked; nil for nil. Before is the action's to
// set once it has found the entry.
func auditOf(a *store.AuditEntry, k store.Scope, action store.AuditAction, force bool) (*store.AuditEntry, error) {
	if a == nil {
		return nil, nil
	}
	e := *a
	e.Scope, e.Action, e.Force, e.Before, e.After = k, action, force, store.InProgress, ""
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// addAuditLocked adds e, which took effect at now, to the audit trail. The
// caller holds s.mu.
func (s *Store) addAuditLocked(e store.AuditEntry, now time.Time) {
	s.auditSeq++
	e.Time = now
	s.audit = append(s.audit, auditRecord{seq: s.auditSeq, entry: e, expiresAt: now.Add(s.retention)})
}

// sweepAuditLocked deletes the audit entries past their retention. The
// caller holds s.mu.
func (s *Store) sweepAuditLocked(now time.Time) {
	s.audit = slices.DeleteFunc(s.audit, func(r auditRecord) bool { return !now.Before(r.expiresAt) })
}

// AddAudit implements [store.Admin].
func (s *Store) AddAudit(ctx context.Context, e store.AuditEntry) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addAuditLocked(e, s.now())
	return nil
}

// auditCursorLen is the length of an audit cursor: a version byte, the
// entry's time in Unix nanoseconds and its seq, big-endian.
const auditCursorLen = 1 + 8 + 8

func (r auditRecord) compare(at int64, seq uint64) int {
	return cmp.Or(cmp.Compare(r.entry.Time.UnixNano(), at), cmp.Compare(r.seq, seq))
}

// AuditLog implements [store.Admin]: it orders the entries by their time
// (by [WithClock]), then by the order they were added in. An entry past
// its retention ([WithAuditRetention]) counts as swept.
func (s *Store) AuditLog(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, string, error) {
	if err := f.Validate(); err != nil {
		return nil, "", err
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	limit := pageSize(f.Limit)
	var (
		afterAt  int64
		afterSeq uint64
		paged    bool
	)
	if f.After != "" {
		b, err := base64.RawURLEncoding.DecodeString(f.After)
		if err != nil || len(b) != auditCursorLen || b[0] != 1 {
			return nil, "", store.ErrInvalidCursor
		}
		afterAt, afterSeq, paged = int64(binary.BigEndian.Uint64(b[1:9])), binary.BigEndian.Uint64(b[9:]), true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var found []auditRecord
	for _, r := range s.audit {
		e := r.entry
		switch {
		case !now.Before(r.expiresAt),
			!f.AllTenants && e.Scope.Tenant != f.Tenant,
			f.Method != "" && e.Scope.Method != f.Method,
			f.Key != "" && e.Scope.Key != f.Key,
			!f.Since.IsZero() && e.Time.Before(f.Since),
			!f.Until.IsZero() && !e.Time.Before(f.Until),
			paged && r.compare(afterAt, afterSeq) <= 0:
			continue
		}
		found = append(found, r)
	}
	slices.SortFunc(found, func(a, b auditRecord) int { return a.compare(b.entry.Time.UnixNano(), b.seq) })
	next := ""
	if len(found) > limit {
		found = found[:limit]
		last := found[limit-1]
		b := []byte{1}
		b = binary.BigEndian.AppendUint64(b, uint64(last.entry.Time.UnixNano()))
		b = binary.BigEndian.AppendUint64(b, last.seq)
		next = base64.RawURLEncoding.EncodeToString(b)
	}
	out := make([]store.AuditEntry, len(found))
	for i, r := range found {
		out[i] = r.entry
	}
	return out, next, nil
}

// Stats implements [store.Admin].
func (s *Store) Stats(ctx context.Context, f store.KeyFilter) (store.KeyStats, error) {
	if err := f.Validate(); err != nil {
		return store.KeyStats{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.KeyStats{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	counts := map[store.KeyCount]int64{}
	var st store.KeyStats
	older := func(old *store.KeyInfo, k store.Scope, e *entry) bool {
		if old == nil {
			return true
		}
		return cursor{At: e.createdAt.UnixNano(), Key: k}.compare(cursor{At: old.CreatedAt.UnixNano(), Key: old.Scope}) < 0
	}
	for k, e := range s.entries {
		state := e.state(now)
		switch {
		case e.pending,
			!f.AllTenants && k.Tenant != f.Tenant,
			f.Method != "" && k.Method != f.Method,
			!f.CreatedAfter.IsZero() && e.createdAt.Before(f.CreatedAfter),
			!f.CreatedBefore.IsZero() && !e.createdAt.Before(f.CreatedBefore),
			len(f.States) > 0 && !slices.Contains(f.States, state):
			continue
		}
		counts[store.KeyCount{Tenant: k.Tenant, Method: k.Method, State: state}]++
		switch {
		case state == store.InProgress && older(st.OldestInProgress, k, e):
			ki := e.info(k, now)
			st.OldestInProgress = &ki
		case state == store.Abandoned && older(st.OldestAbandoned, k, e):
			ki := e.info(k, now)
			st.OldestAbandoned = &ki
		}
	}
	for c, n := range counts {
		c.Count = n
		st.Counts = append(st.Counts, c)
	}
	slices.SortFunc(st.Counts, compareCounts)
	return st, nil
}

// compareCounts orders counts by tenant, method and state.
func compareCounts(a, b store.KeyCount) int {
	return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Method, b.Method), cmp.Compare(a.State, b.State))
}
