package admin_test

import (
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
}

var _ store.Admin = (*fakeStore)(nil)

func (f *fakeStore) find(k store.Scope) int {
	return slices.IndexFunc(f.keys, func(ki store.KeyInfo) bool { return ki.Scope == k })
}

func (f *fakeStore) Keys(_ context.Context, flt store.KeyFilter) ([]store.KeyInfo, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.last = flt
	if f.err != nil {
		return nil, "", f.err
	}
	start := 0
	if after := flt.After; after != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(after, "after:"))
		if err != nil || !strings.HasPrefix(after, "after:") {
			return nil, "", store.ErrInvalidCursor
		}
		start = n
	}
	limit := flt.Limit
	if limit == 0 {
		limit = 100
	}
	var out []store.KeyInfo
	for i := start; i < len(f.keys); i++ {
		ki := f.keys[i]
		if (!flt.AllTenants && ki.Scope.Tenant != flt.Tenant) || (flt.Method != "" && ki.Scope.Method != flt.Method) ||
			(len(flt.States) > 0 && !slices.Contains(flt.States, ki.State)) {
			continue
		}
		if len(out) == limit {
			return out, "after:" + strconv.Itoa(i), nil
		}
		out = append(out, ki)
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
	ki.State, ki.Outcome, ki.LeaseUntil, ki.Call = store.Recorded, &out, time.Time{}, nil
	return nil
}

func (f *fakeStore) storeCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}
