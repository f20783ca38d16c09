package admin_test

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/store"
)

// fakeStore is a store.Admin over a slice, for the service's tests: the
// stores' own behaviour is store/storetest's to prove.
type fakeStore struct {
	mu    sync.Mutex
	now   time.Time
	keys  []store.KeyInfo
	err   error // returned by every method when set
	calls int
	last  store.KeyFilter
	// lastKeys is the filter of the last Keys, which last is too unless
	// a Stats followed.
	lastKeys store.KeyFilter
	audit    []store.AuditEntry
}

var _ store.Admin = (*fakeStore)(nil)

func (f *fakeStore) find(k store.Scope) int {
	return slices.IndexFunc(f.keys, func(ki store.KeyInfo) bool { return ki.Scope == k })
}

func (f *fakeStore) Keys(_ context.Context, flt store.KeyFilter) ([]store.KeyInfo, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.last, f.lastKeys = flt, flt
	if f.err != nil {
		return nil, "", f.err
	}
	return fakePage(f.keys, flt.After, flt.Limit, func(ki store.KeyInfo) bool {
		return (flt.AllTenants || ki.Scope.Tenant == flt.Tenant) && (flt.Method == "" || ki.Scope.Method == flt.Method) &&
			(len(flt.States) == 0 || slices.Contains(flt.States, ki.State))
	})
}

// fakePage is a page of the items that keep selects, from the one the
// cursor after names ("after:N", N the index) and up to limit (100 when
// 0), with the cursor of the next page, "" when none is left.
func fakePage[T any](items []T, after string, limit int, keep func(T) bool) ([]T, string, error) {
	start := 0
	if after != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(after, "after:"))
		if err != nil || !strings.HasPrefix(after, "after:") {
			return nil, "", store.ErrInvalidCursor
		}
		start = n
	}
	limit = cmp.Or(limit, 100)
	var out []T
	for i := start; i < len(items); i++ {
		if !keep(items[i]) {
			continue
		}
		if len(out) == limit {
			return out, "after:" + strconv.Itoa(i), nil
		}
		out = append(out, items[i])
	}
	return out, "", nil
}

func (f *fakeStore) Key(_ context.Context, k store.Scope) (store.KeyInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return store.KeyInfo{}, f.err
	}
	i := f.find(k)
	if i < 0 {
		return store.KeyInfo{}, store.ErrNotFound
	}
	return f.keys[i], nil
}

func (f *fakeStore) live(ki store.KeyInfo) error {
	if ki.State == store.InProgress && ki.LeaseUntil.After(f.now) {
		return &store.LeaseLiveError{Until: ki.LeaseUntil}
	}
	return nil
}

func (f *fakeStore) Forget(_ context.Context, k store.Scope, o store.ForgetOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return f.err
	}
	i := f.find(k)
	if i < 0 {
		return store.ErrNotFound
	}
	if err := f.live(f.keys[i]); err != nil && !o.Force {
		return err
	}
	if o.Audit != nil {
		e := *o.Audit
		e.Scope, e.Action, e.Force, e.Before, e.Time = k, store.ActionForget, o.Force, f.keys[i].State, f.now
		f.audit = append(f.audit, e)
	}
	f.keys = slices.Delete(f.keys, i, i+1)
	return nil
}

func (f *fakeStore) Settle(_ context.Context, k store.Scope, st *spb.Status, o store.SettleOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return f.err
	}
	out, err := store.SettleOutcome(st)
	if err != nil {
		return err
	}
	i := f.find(k)
	if i < 0 {
		return store.ErrNotFound
	}
	ki := &f.keys[i]
	if ki.State == store.Recorded || ki.State == store.Expired {
		return store.ErrNotInProgress
	}
	if err := f.live(*ki); err != nil && !o.Force {
		return err
	}
	if o.Audit != nil {
		e := *o.Audit
		e.Scope, e.Action, e.Force, e.Before, e.After, e.Time = k, store.ActionSettle, o.Force, ki.State, store.Recorded, f.now
		f.audit = append(f.audit, e)
	}
	ki.State, ki.Outcome, ki.LeaseUntil, ki.Call = store.Recorded, &out, time.Time{}, nil
	return nil
}

func (f *fakeStore) storeCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *fakeStore) AddAudit(_ context.Context, e store.AuditEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return f.err
	}
	if err := e.Validate(); err != nil {
		return err
	}
	e.Time = f.now
	f.audit = append(f.audit, e)
	return nil
}

// AuditLog pages as Keys does, by index.
func (f *fakeStore) AuditLog(_ context.Context, flt store.AuditFilter) ([]store.AuditEntry, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, "", f.err
	}
	return fakePage(f.audit, flt.After, flt.Limit, func(e store.AuditEntry) bool {
		return (flt.AllTenants || e.Scope.Tenant == flt.Tenant) && (flt.Method == "" || e.Scope.Method == flt.Method) &&
			(flt.Key == "" || e.Scope.Key == flt.Key)
	})
}

func (f *fakeStore) Stats(_ context.Context, flt store.KeyFilter) (store.KeyStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.last = flt
	if f.err != nil {
		return store.KeyStats{}, f.err
	}
	var st store.KeyStats
	for _, ki := range f.keys {
		if (!flt.AllTenants && ki.Scope.Tenant != flt.Tenant) || (flt.Method != "" && ki.Scope.Method != flt.Method) ||
			(len(flt.States) > 0 && !slices.Contains(flt.States, ki.State)) {
			continue
		}
		i := slices.IndexFunc(st.Counts, func(c store.KeyCount) bool {
			return c.Tenant == ki.Scope.Tenant && c.Method == ki.Scope.Method && c.State == ki.State
		})
		if i < 0 {
			st.Counts = append(st.Counts, store.KeyCount{Tenant: ki.Scope.Tenant, Method: ki.Scope.Method, State: ki.State})
			i = len(st.Counts) - 1
		}
		st.Counts[i].Count++
		switch {
		case ki.State == store.InProgress && st.OldestInProgress == nil:
			st.OldestInProgress = &ki
		case ki.State == store.Abandoned && st.OldestAbandoned == nil:
			st.OldestAbandoned = &ki
		}
	}
	return st, nil
}

func (f *fakeStore) auditEntries() []store.AuditEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.audit)
}
