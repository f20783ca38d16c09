package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/store"
)

// admin returns s as a store.Admin, failing the test if it is none: the
// Admin cases run only for stores that implement it (see Run).
func admin(t *testing.T, s store.Store) store.Admin {
	t.Helper()
	a, ok := s.(store.Admin)
	if !ok {
		t.Fatalf("the store (%T) does not implement store.Admin, though the first store built did", s)
	}
	return a
}

// The options of forced actions.
var (
	forced       = store.ForgetOptions{Force: true}
	forcedSettle = store.SettleOptions{Force: true}
)

// settleStatus is the error an operator settles a key with.
func settleStatus(msg string) *spb.Status {
	return &spb.Status{Code: int32(code.Code_FAILED_PRECONDITION), Message: msg}
}

// settleOutcome is the outcome a Settle with st records.
func settleOutcome(t *testing.T, st *spb.Status) store.Outcome {
	t.Helper()
	out, err := store.SettleOutcome(st)
	if err != nil {
		t.Fatalf("SettleOutcome(%v): %v", st, err)
	}
	return out
}

// keyInfo reads k through a, failing the test on an error.
func keyInfo(t *testing.T, a store.Admin, k store.Scope) store.KeyInfo {
	t.Helper()
	ki, err := a.Key(t.Context(), k)
	if err != nil {
		t.Fatalf("Key(%v): %v", k, err)
	}
	if ki.Scope != k {
		t.Errorf("Key(%v) returned the entry of %v", k, ki.Scope)
	}
	return ki
}

// listAll pages through the entries f selects, pageSize at a time, and
// checks that the pages follow each other: every cursor but the last
// leads to a page, creation times never go back, and no entry comes twice.
func listAll(t *testing.T, a store.Admin, f store.KeyFilter, pageSize int) []store.KeyInfo {
	t.Helper()
	f.Limit = pageSize
	var (
		all   []store.KeyInfo
		after string
		seen  = map[store.Scope]bool{}
	)
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatalf("Keys(%+v) never ends", f)
		}
		f.After = after
		page, next, err := a.Keys(t.Context(), f)
		if err != nil {
			t.Fatalf("Keys(%+v): %v", f, err)
		}
		if len(page) > pageSize {
			t.Fatalf("Keys(%+v) returned %d entries, more than the limit", f, len(page))
		}
		if next != "" && len(page) == 0 {
			t.Fatalf("Keys(%+v) returned an empty page with a next cursor", f)
		}
		for _, ki := range page {
			if seen[ki.Scope] {
				t.Fatalf("Keys(%+v) returned %v twice", f, ki.Scope)
			}
			seen[ki.Scope] = true
			if n := len(all); n > 0 && ki.CreatedAt.Before(all[n-1].CreatedAt) {
				t.Errorf("Keys(%+v): %v created at %v comes after one created at %v", f, ki.Scope, ki.CreatedAt, all[n-1].CreatedAt)
			}
			all = append(all, ki)
		}
		if next == "" {
			return all
		}
		after = next
	}
}

// keysOf returns the keys of list, in its order.
func keysOf(list []store.KeyInfo) []store.Scope {
	out := make([]store.Scope, len(list))
	for i, ki := range list {
		out[i] = ki.Scope
	}
	return out
}

// wantKeys fails the test unless got holds exactly want, in any order.
func wantKeys(t *testing.T, what string, got []store.KeyInfo, want ...store.Scope) {
	t.Helper()
	ks := keysOf(got)
	sortKeys := func(a, b store.Scope) int {
		return cmpStrings(a.Tenant+"\x00"+a.Method+"\x00"+a.Key, b.Tenant+"\x00"+b.Method+"\x00"+b.Key)
	}
	slices.SortFunc(ks, sortKeys)
	want = slices.Clone(want)
	slices.SortFunc(want, sortKeys)
	if !slices.Equal(ks, want) {
		t.Errorf("%s lists %v, want %v", what, ks, want)
	}
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// wantLeaseLive fails the test unless err is a *store.LeaseLiveError
// whose Until is until.
func wantLeaseLive(t *testing.T, what string, err error, until time.Time) {
	t.Helper()
	var live *store.LeaseLiveError
	if !errors.As(err, &live) {
		t.Fatalf("%s: %v, want a *store.LeaseLiveError", what, err)
	}
	wantAbout(t, what+": the live lease's end", live.Until, until)
}

// recordKey claims k atomically and records out.
func recordKey(t *testing.T, s store.Store, k store.Scope, out store.Outcome) {
	t.Helper()
	if err := claimTxn(t, s, k, fp).Record(t.Context(), out); err != nil {
		t.Fatalf("Record(%v): %v", k, err)
	}
}

// keyOf returns the suite's key with another key string.
func keyOf(tenant, method, k string) store.Scope {
	return store.Scope{Tenant: tenant, Method: method, Key: k}
}

// adminCases exercise store.Admin.
var adminCases = []testCase{
	{name: "KeyOfEachState", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		recorded := keyOf(key.Tenant, key.Method, "recorded")
		live := keyOf(key.Tenant, key.Method, "live")
		abandoned := keyOf(key.Tenant, key.Method, "abandoned")
		expired := keyOf(key.Tenant, key.Method, "expired")
		start := cfg.Now()

		recordKey(t, s, recorded, errorOutcome())
		lc, err := s.ClaimLeased(t.Context(), live, store.LeaseRequest{Fingerprint: fp, Call: keptCall, Lease: time.Hour})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease: %s, %v", describeLeasedClaim(lc), err)
		}
		for _, p := range []store.Step{{Name: "reserve"}, {Name: "charge", Result: []byte("ch_1")}} {
			if err := lc.Lease.SaveStep(t.Context(), p); err != nil {
				t.Fatal(err)
			}
		}
		first := takeLease(t, s, abandoned, fp, shortLease)
		if err := first.SaveStep(t.Context(), store.Step{Name: "sent", Result: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ClaimLeased(t.Context(), expired, store.LeaseRequest{Fingerprint: other, TTL: time.Minute, Lease: shortLease}); err != nil {
			t.Fatal(err)
		}

		ki := keyInfo(t, a, recorded)
		if ki.State != store.Recorded || ki.Outcome == nil || ki.Outcome.Code != errorOutcome().Code ||
			!bytes.Equal(ki.Outcome.Body, errorOutcome().Body) || !ki.LeaseUntil.IsZero() || ki.Call != nil || len(ki.Steps) != 0 {
			t.Errorf("the recorded key: %+v", ki)
		}
		if !bytes.Equal(ki.Fingerprint, fp) {
			t.Errorf("the recorded key's fingerprint is %q, want %q", ki.Fingerprint, fp)
		}
		wantAbout(t, "the recorded key's expiry", ki.ExpiresAt, start.Add(cfg.TTL))
		if ki.CreatedAt.IsZero() || ki.UpdatedAt.Before(ki.CreatedAt) {
			t.Errorf("the recorded key was created at %v and updated at %v", ki.CreatedAt, ki.UpdatedAt)
		}

		ki = keyInfo(t, a, live)
		if ki.State != store.InProgress || ki.Outcome != nil || ki.Takeovers != 0 {
			t.Errorf("the leased key: %+v", ki)
		}
		wantAbout(t, "the live lease's end", ki.LeaseUntil, start.Add(time.Hour))
		if len(ki.Steps) != 2 || ki.Steps[0].Name != "reserve" || ki.Steps[1].Name != "charge" || string(ki.Steps[1].Result) != "ch_1" {
			t.Errorf("the leased key's steps: %+v", ki.Steps)
		}
		if c := ki.Call; c == nil || c.Method != keptCall.Method || !bytes.Equal(c.Request, keptCall.Request) ||
			!slices.Equal(c.Metadata["x-roles"], []string{"a", "b"}) || !slices.Equal(c.Metadata["x-trace-bin"], keptCall.Metadata["x-trace-bin"]) {
			t.Errorf("the leased key's kept call: %+v, want %+v", ki.Call, keptCall)
		}

		cfg.advance(runOut)
		ki = keyInfo(t, a, abandoned)
		if ki.State != store.Abandoned || ki.Outcome != nil || len(ki.Steps) != 1 || ki.Steps[0].Name != "sent" {
			t.Errorf("the abandoned key: %+v", ki)
		}
		wantAbout(t, "the abandoned lease's end", ki.LeaseUntil, start.Add(shortLease))
		second := takeLease(t, s, abandoned, fp, shortLease)
		if ki := keyInfo(t, a, abandoned); ki.State != store.InProgress || ki.Takeovers != 1 {
			t.Errorf("the key taken over: %+v, want in progress with 1 takeover", ki)
		}
		_ = second

		cfg.advance(2 * time.Minute)
		ki = keyInfo(t, a, expired)
		if ki.State != store.Expired || !bytes.Equal(ki.Fingerprint, other) {
			t.Errorf("the expired key: %+v", ki)
		}
		wantAbout(t, "the expired key's expiry", ki.ExpiresAt, start.Add(time.Minute))
		if ki := keyInfo(t, a, live); ki.State != store.InProgress {
			t.Errorf("the key leased for an hour is %s two minutes on, want in progress", ki.State)
		}
	}},

	{name: "UnknownKeysAreNotFound", run: func(t *testing.T, s store.Store, _ Config) {
		a := admin(t, s)
		recordKey(t, s, key, okOutcome("r"))
		for _, k := range []store.Scope{
			keyOf(key.Tenant, key.Method, "missing"),
			keyOf("other-tenant", key.Method, key.Key),
			keyOf(key.Tenant, "/idem.test.v1.Test/Other", key.Key),
		} {
			if _, err := a.Key(t.Context(), k); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Key(%v): %v, want ErrNotFound", k, err)
			}
			if err := a.Forget(t.Context(), k, forced); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Forget(%v): %v, want ErrNotFound", k, err)
			}
			if err := a.Settle(t.Context(), k, settleStatus("s"), forcedSettle); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Settle(%v): %v, want ErrNotFound", k, err)
			}
		}
		// An atomic claim still running has no entry anyone sees.
		running := keyOf(key.Tenant, key.Method, "running")
		_ = claimTxn(t, s, running, fp)
		if _, err := a.Key(t.Context(), running); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Key of an atomic claim running: %v, want ErrNotFound", err)
		}
		wantKeys(t, "Keys during an atomic claim", listAll(t, a, store.KeyFilter{Tenant: key.Tenant}, 10), key)
	}},

	{name: "InvalidKeysAreRefused", run: func(t *testing.T, s store.Store, _ Config) {
		a := admin(t, s)
		for _, k := range []store.Scope{
			{Tenant: key.Tenant, Method: "", Key: key.Key},
			{Tenant: key.Tenant, Method: key.Method, Key: ""},
			{Tenant: key.Tenant, Method: key.Method, Key: "nul\x00"},
		} {
			if _, err := a.Key(t.Context(), k); !errors.Is(err, store.ErrInvalidScope) {
				t.Errorf("Key(%q): %v, want ErrInvalidScope", k, err)
			}
			if err := a.Forget(t.Context(), k, forced); !errors.Is(err, store.ErrInvalidScope) {
				t.Errorf("Forget(%q): %v, want ErrInvalidScope", k, err)
			}
			if err := a.Settle(t.Context(), k, settleStatus("s"), forcedSettle); !errors.Is(err, store.ErrInvalidScope) {
				t.Errorf("Settle(%q): %v, want ErrInvalidScope", k, err)
			}
		}
	}},

	{name: "InvalidFiltersAreRefused", run: func(t *testing.T, s store.Store, _ Config) {
		a := admin(t, s)
		recordKey(t, s, key, okOutcome("r"))
		for name, f := range map[string]store.KeyFilter{
			"a tenant with a NUL byte":     {Tenant: "nul\x00"},
			"a tenant not UTF-8":           {Tenant: "bad-\xff"},
			"a tenant past its bound":      {Tenant: strings.Repeat("t", store.MaxTenantLength+1)},
			"a method with a NUL byte":     {Tenant: key.Tenant, Method: "/nul\x00"},
			"every tenant's, a NUL method": {AllTenants: true, Method: "/nul\x00"},
			"a method not UTF-8":           {AllTenants: true, Method: "/bad-\xc3"},
			"a method past its bound":      {AllTenants: true, Method: strings.Repeat("m", store.MaxMethodLength+1)},
			"a state that is none of them": {AllTenants: true, States: []store.State{store.Recorded, "done"}},
			"a state with a NUL byte":      {AllTenants: true, States: []store.State{"recorded\x00"}},
		} {
			page, next, err := a.Keys(t.Context(), f)
			if !errors.Is(err, store.ErrInvalidScope) {
				t.Errorf("Keys of %s: %d entries, next %q, %v; want ErrInvalidScope", name, len(page), next, err)
			}
		}
		// A tenant that AllTenants ignores is not looked at.
		wantKeys(t, "every tenant's keys, with an ignored tenant", listAll(t, a, store.KeyFilter{AllTenants: true, Tenant: "nul\x00"}, 10), key)
	}},

	{name: "KeysFilterAndPage", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		const lease = "/idem.test.v1.Test/Lease"
		var mine, theirs, leased []store.Scope
		for i := range 7 {
			k := keyOf(key.Tenant, key.Method, fmt.Sprint("k-", i))
			recordKey(t, s, k, okOutcome(k.Key))
			mine = append(mine, k)
			cfg.advance(time.Second)
		}
		for i := range 3 {
			k := keyOf("other-tenant", key.Method, fmt.Sprint("k-", i))
			recordKey(t, s, k, okOutcome(k.Key))
			theirs = append(theirs, k)
		}
		for i := range 2 {
			k := keyOf(key.Tenant, lease, fmt.Sprint("l-", i))
			_ = takeLease(t, s, k, fp, time.Hour)
			leased = append(leased, k)
		}

		tenant := slices.Concat(mine, leased)
		all := slices.Concat(mine, theirs, leased)
		for _, size := range []int{1, 2, 5, 100} {
			wantKeys(t, fmt.Sprintf("the tenant's keys, %d a page", size), listAll(t, a, store.KeyFilter{Tenant: key.Tenant}, size), tenant...)
			wantKeys(t, fmt.Sprintf("every tenant's keys, %d a page", size), listAll(t, a, store.KeyFilter{AllTenants: true, Tenant: "ignored"}, size), all...)
		}
		wantKeys(t, "the other tenant's keys", listAll(t, a, store.KeyFilter{Tenant: "other-tenant"}, 2), theirs...)
		wantKeys(t, "the empty tenant's keys", listAll(t, a, store.KeyFilter{}, 2))
		wantKeys(t, "the keys of one method", listAll(t, a, store.KeyFilter{AllTenants: true, Method: lease}, 1), leased...)
		wantKeys(t, "the keys in progress", listAll(t, a, store.KeyFilter{AllTenants: true, States: []store.State{store.InProgress}}, 1), leased...)
		wantKeys(t, "the keys recorded of the tenant",
			listAll(t, a, store.KeyFilter{Tenant: key.Tenant, States: []store.State{store.Recorded, store.Expired}}, 3), mine...)
		wantKeys(t, "the keys abandoned", listAll(t, a, store.KeyFilter{AllTenants: true, States: []store.State{store.Abandoned}}, 3))

		// Creation times: [created of k-2, created of k-5) holds k-2 to k-4.
		from, to := keyInfo(t, a, mine[2]).CreatedAt, keyInfo(t, a, mine[5]).CreatedAt
		wantKeys(t, "the keys created in a range", listAll(t, a, store.KeyFilter{Tenant: key.Tenant, CreatedAfter: from, CreatedBefore: to}, 2), mine[2:5]...)
		wantKeys(t, "the keys created before", listAll(t, a, store.KeyFilter{Tenant: key.Tenant, Method: key.Method, CreatedBefore: to}, 2), mine[:5]...)
		wantKeys(t, "the keys created after", listAll(t, a, store.KeyFilter{Tenant: key.Tenant, Method: key.Method, CreatedAfter: from}, 2), mine[2:]...)

		// The default limit and the last page's cursor.
		page, next, err := a.Keys(t.Context(), store.KeyFilter{AllTenants: true})
		if err != nil || len(page) != len(all) || next != "" {
			t.Errorf("Keys without a limit: %d entries, next %q, %v; want %d and no next page", len(page), next, err, len(all))
		}

		// A cursor the store did not make.
		_, next, err = a.Keys(t.Context(), store.KeyFilter{AllTenants: true, Limit: 1})
		if err != nil || next == "" {
			t.Fatalf("first page of 1: next %q, %v", next, err)
		}
		for _, bad := range []string{"not a cursor!", next[:len(next)/2], "e30", "AAAA"} {
			if _, _, err := a.Keys(t.Context(), store.KeyFilter{AllTenants: true, Limit: 1, After: bad}); !errors.Is(err, store.ErrInvalidCursor) {
				t.Errorf("Keys after %q: %v, want ErrInvalidCursor", bad, err)
			}
		}
	}},

	{name: "ForgetLetsTheKeyRunAfresh", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		recordKey(t, s, key, okOutcome("first"))
		if err := a.Forget(t.Context(), key, store.ForgetOptions{}); err != nil {
			t.Fatalf("Forget of a recorded key: %v", err)
		}
		if _, err := a.Key(t.Context(), key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Key after Forget: %v, want ErrNotFound", err)
		}
		if err := claimTxn(t, s, key, other).Record(t.Context(), okOutcome("second")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, claimEntry(t, s, key, other), other, okOutcome("second"))

		// An abandoned lease is forgotten without force, an expired key too.
		l := takeLease(t, s, leaseKey, fp, shortLease)
		expired := keyOf(key.Tenant, key.Method, "expired")
		if _, err := s.ClaimLeased(t.Context(), expired, store.LeaseRequest{Fingerprint: fp, TTL: time.Minute, Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
		cfg.advance(2 * time.Minute)
		for _, k := range []store.Scope{leaseKey, expired} {
			if err := a.Forget(t.Context(), k, store.ForgetOptions{}); err != nil {
				t.Fatalf("Forget(%v): %v", k, err)
			}
		}
		if err := l.Record(t.Context(), okOutcome("late")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Record of a forgotten lease: %v, want ErrLeaseLost", err)
		}
		fresh := takeLeasedClaim(t, s, leaseKey, fp, time.Hour)
		if fresh.TookOver {
			t.Errorf("the lease of a forgotten key reports a takeover")
		}
	}},

	{name: "ForgetRefusesALiveLeaseUnlessForced", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		l := takeLease(t, s, leaseKey, fp, longLease)
		err := a.Forget(t.Context(), leaseKey, store.ForgetOptions{})
		wantLeaseLive(t, "Forget of a live lease", err, cfg.Now().Add(longLease))
		if err := l.SaveStep(t.Context(), store.Step{Name: "kept"}); err != nil {
			t.Fatalf("SaveStep after a refused Forget: %v", err)
		}
		if err := a.Forget(t.Context(), leaseKey, forced); err != nil {
			t.Fatalf("forced Forget: %v", err)
		}
		if err := l.SaveStep(t.Context(), store.Step{Name: "fenced"}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("SaveStep after a forced Forget: %v, want ErrLeaseLost", err)
		}
		// A new claim of the key, and the fenced holder still cannot write.
		next := takeLeasedClaim(t, s, leaseKey, fp, longLease)
		if next.TookOver {
			t.Errorf("the lease after a forced Forget reports a takeover")
		}
		if err := l.Record(t.Context(), okOutcome("fenced")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Record after a forced Forget: %v, want ErrLeaseLost", err)
		}
		if err := next.Lease.Record(t.Context(), okOutcome("next")); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, leaseEntry(t, s, leaseKey, fp, longLease), fp, okOutcome("next"))
	}},

	{name: "SettleAnAbandonedKey", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		lc, err := s.ClaimLeased(t.Context(), leaseKey, store.LeaseRequest{Fingerprint: fp, Call: keptCall, Lease: shortLease})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease: %s, %v", describeLeasedClaim(lc), err)
		}
		if err := lc.Lease.SaveStep(t.Context(), store.Step{Name: "charge", Result: []byte("ch_1")}); err != nil {
			t.Fatal(err)
		}
		expiresAt := lc.ExpiresAt
		cfg.advance(runOut)
		st := settleStatus("cancelled by an operator")
		settled := settleOutcome(t, st)
		if err := a.Settle(t.Context(), leaseKey, st, store.SettleOptions{}); err != nil {
			t.Fatalf("Settle of an abandoned key: %v", err)
		}
		ki := keyInfo(t, a, leaseKey)
		if ki.State != store.Recorded || ki.Outcome == nil || ki.Outcome.Code != settled.Code ||
			!bytes.Equal(ki.Outcome.Body, settled.Body) || ki.Call != nil || len(ki.Steps) != 0 || !ki.LeaseUntil.IsZero() {
			t.Errorf("the settled key: %+v", ki)
		}
		wantAbout(t, "the settled key's expiry", ki.ExpiresAt, expiresAt)
		// Retries replay the settled outcome, atomic and leased alike, and
		// a finisher has nothing left to run.
		wantRecorded(t, claimEntry(t, s, leaseKey, fp), fp, settled)
		wantRecorded(t, leaseEntry(t, s, leaseKey, fp, longLease), fp, settled)
		if f, ok := s.(store.Finishing); ok {
			if got := abandonedKeys(t, f, 0); len(got) != 0 {
				t.Errorf("Abandoned after Settle: %v", got)
			}
		}
		if err := lc.Lease.Record(t.Context(), okOutcome("late")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Record of a settled lease: %v, want ErrLeaseLost", err)
		}
		// Recorded already: refused, forced or not.
		for _, force := range []bool{false, true} {
			if err := a.Settle(t.Context(), leaseKey, settleStatus("again"), store.SettleOptions{Force: force}); !errors.Is(err, store.ErrNotInProgress) {
				t.Errorf("Settle (force %v) of a settled key: %v, want ErrNotInProgress", force, err)
			}
		}
		recordKey(t, s, key, okOutcome("r"))
		if err := a.Settle(t.Context(), key, settleStatus("s"), forcedSettle); !errors.Is(err, store.ErrNotInProgress) {
			t.Errorf("Settle of a recorded key: %v, want ErrNotInProgress", err)
		}
		wantRecorded(t, claimEntry(t, s, key, fp), fp, okOutcome("r"))
	}},

	{name: "SettleRefusesALiveLeaseUnlessForced", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		l := takeLease(t, s, leaseKey, fp, longLease)
		err := a.Settle(t.Context(), leaseKey, settleStatus("settled"), store.SettleOptions{})
		wantLeaseLive(t, "Settle of a live lease", err, cfg.Now().Add(longLease))
		if ki := keyInfo(t, a, leaseKey); ki.State != store.InProgress {
			t.Errorf("the key after a refused Settle is %s, want in progress", ki.State)
		}
		if err := a.Settle(t.Context(), leaseKey, settleStatus("settled"), forcedSettle); err != nil {
			t.Fatalf("forced Settle: %v", err)
		}
		if err := l.Extend(t.Context(), longLease); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Extend after a forced Settle: %v, want ErrLeaseLost", err)
		}
		if err := l.SaveStep(t.Context(), store.Step{Name: "fenced"}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("SaveStep after a forced Settle: %v, want ErrLeaseLost", err)
		}
		if err := l.Record(t.Context(), okOutcome("holder")); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Record after a forced Settle: %v, want ErrLeaseLost", err)
		}
		wantRecorded(t, claimEntry(t, s, leaseKey, fp), fp, settleOutcome(t, settleStatus("settled")))
	}},

	{name: "SettleRefusesAStatusItCannotRecord", run: func(t *testing.T, s store.Store, cfg Config) {
		// OK, a code outside gRPC's and the codes clients retry are
		// refused, forced or not, and change nothing: the lease stays
		// its holder's.
		a := admin(t, s)
		l := takeLease(t, s, leaseKey, fp, shortLease)
		cfg.advance(runOut)
		for _, st := range []*spb.Status{
			nil,
			{Code: int32(code.Code_OK)},
			{Code: 17, Message: "no such code"},
			{Code: -1},
			{Code: int32(code.Code_ABORTED), Message: "retry"},
			{Code: int32(code.Code_UNAVAILABLE)},
			{Code: int32(code.Code_RESOURCE_EXHAUSTED)},
			{Code: int32(code.Code_DEADLINE_EXCEEDED)},
			{Code: int32(code.Code_FAILED_PRECONDITION), Message: "not UTF-8: \xff"},
		} {
			for _, o := range []store.SettleOptions{{}, forcedSettle} {
				if err := a.Settle(t.Context(), leaseKey, st, o); !errors.Is(err, store.ErrInvalidStatus) {
					t.Errorf("Settle(%v, force %v): %v, want ErrInvalidStatus", st, o.Force, err)
				}
			}
		}
		if ki := keyInfo(t, a, leaseKey); ki.State != store.Abandoned || ki.Outcome != nil {
			t.Errorf("the key after the refused settles: %+v, want it abandoned", ki)
		}
		if err := l.Record(t.Context(), okOutcome("holder")); err != nil {
			t.Fatalf("the holder's Record after the refused settles: %v", err)
		}
		wantRecorded(t, claimEntry(t, s, leaseKey, fp), fp, okOutcome("holder"))
	}},

	{name: "FencedHolderLosesEveryWrite", run: func(t *testing.T, s store.Store, _ Config) {
		// A holder fenced by a forced Forget or Settle gets ErrLeaseLost
		// from every write, however many and in whatever order, and none
		// changes the key: not a second Record, not after a new claim.
		a := admin(t, s)
		writes := map[string]func(l store.Lease) error{
			"Record":   func(l store.Lease) error { return l.Record(t.Context(), okOutcome("fenced")) },
			"SaveStep": func(l store.Lease) error { return l.SaveStep(t.Context(), store.Step{Name: "fenced"}) },
			"Extend":   func(l store.Lease) error { return l.Extend(t.Context(), 10*longLease) },
		}
		orders := [][]string{
			{"Record", "Record", "SaveStep", "Extend", "Record"},
			{"SaveStep", "SaveStep", "Record", "Extend", "Record"},
			{"Extend", "Extend", "Record", "SaveStep", "Record"},
		}
		writeAll := func(t *testing.T, l store.Lease, what string, order []string) {
			t.Helper()
			for i, w := range order {
				if err := writes[w](l); !errors.Is(err, store.ErrLeaseLost) {
					t.Errorf("%s, write %d of %v (%s): %v, want ErrLeaseLost", what, i+1, order, w, err)
				}
			}
		}
		for i, order := range orders {
			// A forced Forget, and the key claimed again by another request.
			k := keyOf(leaseKey.Tenant, leaseKey.Method, fmt.Sprint("forgotten-", i))
			l := takeLease(t, s, k, fp, longLease)
			if err := a.Forget(t.Context(), k, forced); err != nil {
				t.Fatalf("forced Forget: %v", err)
			}
			writeAll(t, l, "after a forced Forget", order)
			if _, err := a.Key(t.Context(), k); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Key of the forgotten key after the fenced writes: %v, want ErrNotFound", err)
			}
			next := takeLease(t, s, k, other, longLease)
			writeAll(t, l, "after a forced Forget and a new claim", order)
			if ki := keyInfo(t, a, k); ki.State != store.InProgress || len(ki.Steps) != 0 || !bytes.Equal(ki.Fingerprint, other) {
				t.Errorf("the new claim after the fenced writes: %+v", ki)
			}
			if err := next.Record(t.Context(), okOutcome("next")); err != nil {
				t.Fatalf("the new claim's Record: %v", err)
			}
			wantRecorded(t, claimEntry(t, s, k, other), other, okOutcome("next"))

			// A forced Settle.
			k = keyOf(leaseKey.Tenant, leaseKey.Method, fmt.Sprint("settled-", i))
			l = takeLease(t, s, k, fp, longLease)
			if err := a.Settle(t.Context(), k, settleStatus("fenced"), forcedSettle); err != nil {
				t.Fatalf("forced Settle: %v", err)
			}
			writeAll(t, l, "after a forced Settle", order)
			if ki := keyInfo(t, a, k); ki.State != store.Recorded || len(ki.Steps) != 0 || !ki.LeaseUntil.IsZero() {
				t.Errorf("the settled key after the fenced writes: %+v", ki)
			}
			wantRecorded(t, claimEntry(t, s, k, fp), fp, settleOutcome(t, settleStatus("fenced")))
			if err := l.Release(t.Context()); err != nil && !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("Release of the fenced lease: %v, want nil or ErrLeaseLost", err)
			}
			wantRecorded(t, claimEntry(t, s, k, fp), fp, settleOutcome(t, settleStatus("fenced")))
		}
	}},

	{name: "SettleOfAnExpiredKeyIsNotFound", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		if _, err := s.ClaimLeased(t.Context(), leaseKey, store.LeaseRequest{Fingerprint: fp, TTL: time.Minute, Lease: shortLease}); err != nil {
			t.Fatal(err)
		}
		cfg.advance(2 * time.Minute)
		if err := a.Settle(t.Context(), leaseKey, settleStatus("s"), forcedSettle); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Settle of an expired key: %v, want ErrNotFound", err)
		}
	}},
}
