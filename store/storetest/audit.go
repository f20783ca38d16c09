package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// auditBy returns the audit entry an operator's action gives a store.
func auditBy(operator, reason string) *store.AuditEntry {
	return &store.AuditEntry{Operator: operator, Reason: reason, RequestID: "req-" + operator, Peer: "127.0.0.1:4000"}
}

// auditLog pages through the audit entries f selects, pageSize at a time,
// and checks that the pages follow each other in time.
func auditLog(t *testing.T, a store.Admin, f store.AuditFilter, pageSize int) []store.AuditEntry {
	t.Helper()
	f.Limit = pageSize
	var all []store.AuditEntry
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatalf("AuditLog(%+v) never ends", f)
		}
		page, next, err := a.AuditLog(t.Context(), f)
		if err != nil {
			t.Fatalf("AuditLog(%+v): %v", f, err)
		}
		if len(page) > pageSize {
			t.Fatalf("AuditLog(%+v) returned %d entries, more than the limit", f, len(page))
		}
		if next != "" && len(page) == 0 {
			t.Fatalf("AuditLog(%+v) returned an empty page with a next cursor", f)
		}
		for _, e := range page {
			if n := len(all); n > 0 && e.Time.Before(all[n-1].Time) {
				t.Errorf("AuditLog(%+v): an entry at %v comes after one at %v", f, e.Time, all[n-1].Time)
			}
			all = append(all, e)
		}
		if next == "" {
			return all
		}
		f.After = next
	}
}

// wantAudit fails the test unless got is want, but for its Time, which
// must be about at.
func wantAudit(t *testing.T, what string, got, want store.AuditEntry, at time.Time) {
	t.Helper()
	wantAbout(t, what+": its time", got.Time, at)
	got.Time = time.Time{}
	if got != want {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// reasonsOf returns the reasons of entries, in order: what tells the
// cases' entries apart.
func reasonsOf(entries []store.AuditEntry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Reason
	}
	return out
}

// auditCases exercise the audit trail and the counts of store.Admin.
var auditCases = []testCase{
	{name: "ActionsAreAudited", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		recordKey(t, s, key, okOutcome("r"))
		start := cfg.Now()
		if err := a.Forget(t.Context(), key, store.ForgetOptions{Audit: auditBy("alice", "")}); err != nil {
			t.Fatal(err)
		}
		cfg.advance(time.Second)
		// An abandoned lease, settled; a live one, forgotten by force.
		_ = takeLease(t, s, leaseKey, fp, shortLease)
		cfg.advance(runOut)
		if err := a.Settle(t.Context(), leaseKey, settleStatus("cancelled"), store.SettleOptions{Audit: auditBy("bob", "the charge failed at the bank")}); err != nil {
			t.Fatal(err)
		}
		live := keyOf(key.Tenant, key.Method, "live")
		_ = takeLease(t, s, live, fp, longLease)
		cfg.advance(time.Second)
		if err := a.Forget(t.Context(), live, store.ForgetOptions{Force: true, Audit: auditBy("carol", "stuck in a loop")}); err != nil {
			t.Fatal(err)
		}

		got := auditLog(t, a, store.AuditFilter{Tenant: key.Tenant}, 10)
		if len(got) != 3 {
			t.Fatalf("the audit trail holds %d entries, want 3: %+v", len(got), got)
		}
		wantAudit(t, "the forget", got[0], store.AuditEntry{Scope: key, Action: store.ActionForget, Operator: "alice",
			Before: store.Recorded, RequestID: "req-alice", Peer: "127.0.0.1:4000"}, start)
		wantAudit(t, "the settle", got[1], store.AuditEntry{Scope: leaseKey, Action: store.ActionSettle, Operator: "bob",
			Reason: "the charge failed at the bank", Before: store.Abandoned, After: store.Recorded, RequestID: "req-bob", Peer: "127.0.0.1:4000"},
			start.Add(time.Second+runOut))
		wantAudit(t, "the forced forget", got[2], store.AuditEntry{Scope: live, Action: store.ActionForget, Operator: "carol",
			Reason: "stuck in a loop", Force: true, Before: store.InProgress, RequestID: "req-carol", Peer: "127.0.0.1:4000"},
			start.Add(2*time.Second+runOut))

		// A key's history outlives its entry and a new claim of it.
		recordKey(t, s, key, okOutcome("again"))
		cfg.advance(time.Second)
		if err := a.Forget(t.Context(), key, store.ForgetOptions{Audit: auditBy("dave", "second time")}); err != nil {
			t.Fatal(err)
		}
		hist := auditLog(t, a, store.AuditFilter{Tenant: key.Tenant, Method: key.Method, Key: key.Key}, 1)
		if r := reasonsOf(hist); !slices.Equal(r, []string{"", "second time"}) {
			t.Errorf("the key's history: %q, want the two forgets", r)
		}
		// An action without an entry adds none.
		recordKey(t, s, key, okOutcome("third"))
		if err := a.Forget(t.Context(), key, store.ForgetOptions{}); err != nil {
			t.Fatal(err)
		}
		if n := len(auditLog(t, a, store.AuditFilter{AllTenants: true}, 100)); n != 4 {
			t.Errorf("the audit trail holds %d entries after a forget without one, want 4", n)
		}
	}},

	{name: "RefusedActionsAreNotAudited", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		_ = takeLease(t, s, leaseKey, fp, longLease)
		recordKey(t, s, key, okOutcome("r"))
		missing := keyOf(key.Tenant, key.Method, "missing")
		if err := a.Forget(t.Context(), leaseKey, store.ForgetOptions{Audit: auditBy("a", "x")}); err == nil {
			t.Error("an unforced Forget of a live lease succeeded")
		}
		if err := a.Settle(t.Context(), leaseKey, settleStatus("s"), store.SettleOptions{Audit: auditBy("a", "x")}); err == nil {
			t.Error("an unforced Settle of a live lease succeeded")
		}
		if err := a.Settle(t.Context(), key, settleStatus("s"), store.SettleOptions{Force: true, Audit: auditBy("a", "x")}); !errors.Is(err, store.ErrNotInProgress) {
			t.Errorf("Settle of a recorded key: %v", err)
		}
		if err := a.Forget(t.Context(), missing, store.ForgetOptions{Audit: auditBy("a", "x")}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Forget of a missing key: %v", err)
		}
		if got := auditLog(t, a, store.AuditFilter{AllTenants: true}, 10); len(got) != 0 {
			t.Errorf("refused actions left audit entries: %+v", got)
		}
	}},

	{name: "InvalidAuditIsRefused", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		recordKey(t, s, key, okOutcome("r"))
		for name, e := range map[string]*store.AuditEntry{
			"a reason past its bound":  {Operator: "a", Reason: strings.Repeat("r", store.MaxReasonLength+1)},
			"a reason with a NUL byte": {Operator: "a", Reason: "a\x00b"},
			"an operator not UTF-8":    {Operator: "bad-\xff"},
			"a peer past its bound":    {Peer: strings.Repeat("p", store.MaxAuditFieldLength+1)},
		} {
			if err := a.Forget(t.Context(), key, store.ForgetOptions{Force: true, Audit: e}); !errors.Is(err, store.ErrInvalidAudit) {
				t.Errorf("Forget with %s: %v, want ErrInvalidAudit", name, err)
			}
			if err := a.Settle(t.Context(), key, settleStatus("s"), store.SettleOptions{Force: true, Audit: e}); !errors.Is(err, store.ErrInvalidAudit) {
				t.Errorf("Settle with %s: %v, want ErrInvalidAudit", name, err)
			}
			added := *e
			added.Scope, added.Action, added.Before = key, store.ActionFinish, store.Abandoned
			if err := a.AddAudit(t.Context(), added); !errors.Is(err, store.ErrInvalidAudit) {
				t.Errorf("AddAudit with %s: %v, want ErrInvalidAudit", name, err)
			}
		}
		for name, e := range map[string]store.AuditEntry{
			"no action":   {Scope: key, Before: store.Abandoned},
			"no state":    {Scope: key, Action: store.ActionFinish},
			"a bad scope": {Scope: keyOf(key.Tenant, "", key.Key), Action: store.ActionFinish, Before: store.Abandoned},
		} {
			if err := a.AddAudit(t.Context(), e); !errors.Is(err, store.ErrInvalidAudit) {
				t.Errorf("AddAudit with %s: %v, want ErrInvalidAudit", name, err)
			}
		}
		keyInfo(t, a, key) // still there
		if got := auditLog(t, a, store.AuditFilter{AllTenants: true}, 10); len(got) != 0 {
			t.Errorf("refused entries were kept: %+v", got)
		}
		for name, f := range map[string]store.AuditFilter{
			"a key without a method":      {Tenant: key.Tenant, Key: key.Key},
			"a key of every tenant":       {AllTenants: true, Method: key.Method, Key: key.Key},
			"a tenant with a NUL byte":    {Tenant: "a\x00"},
			"a method past its bound":     {AllTenants: true, Method: strings.Repeat("m", store.MaxMethodLength+1)},
			"a key that is not UTF-8":     {Tenant: key.Tenant, Method: key.Method, Key: "bad-\xff"},
			"a tenant past its bound":     {Tenant: strings.Repeat("t", store.MaxTenantLength+1)},
			"a method filter with NUL":    {Tenant: key.Tenant, Method: "/a\x00"},
			"a key filter past its bound": {Tenant: key.Tenant, Method: key.Method, Key: strings.Repeat("k", store.MaxKeyLength+1)},
		} {
			if _, _, err := a.AuditLog(t.Context(), f); !errors.Is(err, store.ErrInvalidAudit) {
				t.Errorf("AuditLog of %s: %v, want ErrInvalidAudit", name, err)
			}
		}
	}},

	{name: "AuditLogFilterAndPage", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		const other = "/idem.test.v1.Test/Other"
		start := cfg.Now()
		add := func(k store.Scope, reason string) {
			t.Helper()
			if err := a.AddAudit(t.Context(), store.AuditEntry{Scope: k, Action: store.ActionFinish, Operator: "op",
				Reason: reason, Before: store.Abandoned, After: store.Recorded}); err != nil {
				t.Fatalf("AddAudit: %v", err)
			}
		}
		for i := range 5 {
			add(key, fmt.Sprint("key-", i))
			add(keyOf(key.Tenant, other, key.Key), fmt.Sprint("other-", i))
			add(keyOf("other-tenant", key.Method, key.Key), fmt.Sprint("tenant-", i))
			cfg.advance(time.Second)
		}
		for _, size := range []int{1, 2, 100} {
			if got := reasonsOf(auditLog(t, a, store.AuditFilter{Tenant: key.Tenant, Method: key.Method, Key: key.Key}, size)); !slices.Equal(got, []string{"key-0", "key-1", "key-2", "key-3", "key-4"}) {
				t.Errorf("the key's history, %d a page: %q", size, got)
			}
			if n := len(auditLog(t, a, store.AuditFilter{AllTenants: true, Tenant: "ignored"}, size)); n != 15 {
				t.Errorf("every tenant's entries, %d a page: %d, want 15", size, n)
			}
			if n := len(auditLog(t, a, store.AuditFilter{Tenant: key.Tenant}, size)); n != 10 {
				t.Errorf("the tenant's entries, %d a page: %d, want 10", size, n)
			}
		}
		if got := reasonsOf(auditLog(t, a, store.AuditFilter{AllTenants: true, Method: other}, 2)); len(got) != 5 || got[0] != "other-0" {
			t.Errorf("the method's entries: %q", got)
		}
		if got := reasonsOf(auditLog(t, a, store.AuditFilter{Tenant: "other-tenant", Since: start.Add(time.Second), Until: start.Add(3 * time.Second)}, 1)); !slices.Equal(got, []string{"tenant-1", "tenant-2"}) {
			t.Errorf("the entries of [1 s, 3 s): %q", got)
		}
		if got := auditLog(t, a, store.AuditFilter{Tenant: key.Tenant, Method: key.Method, Key: "unknown"}, 10); len(got) != 0 {
			t.Errorf("an unknown key's history: %+v", got)
		}
		_, next, err := a.AuditLog(t.Context(), store.AuditFilter{AllTenants: true, Limit: 1})
		if err != nil || next == "" {
			t.Fatalf("first page of 1: next %q, %v", next, err)
		}
		for _, bad := range []string{"not a cursor!", next[:len(next)/2], "e30", "AAAA"} {
			if _, _, err := a.AuditLog(t.Context(), store.AuditFilter{AllTenants: true, Limit: 1, After: bad}); !errors.Is(err, store.ErrInvalidCursor) {
				t.Errorf("AuditLog after %q: %v, want ErrInvalidCursor", bad, err)
			}
		}
	}},

	{name: "StatsCountAndFindTheOldest", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		const lease = "/idem.test.v1.Test/Lease"
		oldAbandoned := keyOf(key.Tenant, lease, "abandoned-0")
		_ = takeLease(t, s, oldAbandoned, fp, shortLease)
		cfg.advance(time.Second)
		_ = takeLease(t, s, keyOf(key.Tenant, lease, "abandoned-1"), fp, shortLease)
		cfg.advance(time.Second)
		oldLive := keyOf("other-tenant", lease, "live-0")
		_ = takeLease(t, s, oldLive, fp, longLease)
		cfg.advance(time.Second)
		_ = takeLease(t, s, keyOf(key.Tenant, lease, "live-1"), fp, longLease)
		for i := range 3 {
			recordKey(t, s, keyOf(key.Tenant, key.Method, fmt.Sprint("r-", i)), okOutcome("r"))
		}
		recordKey(t, s, keyOf("other-tenant", key.Method, "r"), okOutcome("r"))
		cfg.advance(runOut)

		st, err := a.Stats(t.Context(), store.KeyFilter{AllTenants: true})
		if err != nil {
			t.Fatal(err)
		}
		want := []store.KeyCount{
			{Tenant: key.Tenant, Method: lease, State: store.Abandoned, Count: 2},
			{Tenant: key.Tenant, Method: lease, State: store.InProgress, Count: 1},
			{Tenant: key.Tenant, Method: key.Method, State: store.Recorded, Count: 3},
			{Tenant: "other-tenant", Method: lease, State: store.InProgress, Count: 1},
			{Tenant: "other-tenant", Method: key.Method, State: store.Recorded, Count: 1},
		}
		slices.SortFunc(want, func(a, b store.KeyCount) int {
			return strings.Compare(a.Tenant+"\x00"+a.Method+"\x00"+string(a.State), b.Tenant+"\x00"+b.Method+"\x00"+string(b.State))
		})
		if !slices.Equal(st.Counts, want) {
			t.Errorf("every tenant's counts:\n got %+v\nwant %+v", st.Counts, want)
		}
		if o := st.OldestInProgress; o == nil || o.Scope != oldLive || o.State != store.InProgress {
			t.Errorf("the oldest in progress: %+v, want %v", o, oldLive)
		}
		if o := st.OldestAbandoned; o == nil || o.Scope != oldAbandoned || o.State != store.Abandoned {
			t.Errorf("the oldest abandoned: %+v, want %v", o, oldAbandoned)
		}

		// One tenant's stuck keys.
		st, err = a.Stats(t.Context(), store.KeyFilter{Tenant: key.Tenant, States: []store.State{store.InProgress, store.Abandoned}})
		if err != nil {
			t.Fatal(err)
		}
		stuck := []store.KeyCount{
			{Tenant: key.Tenant, Method: lease, State: store.Abandoned, Count: 2},
			{Tenant: key.Tenant, Method: lease, State: store.InProgress, Count: 1},
		}
		if !slices.Equal(st.Counts, stuck) {
			t.Errorf("the tenant's stuck keys:\n got %+v\nwant %+v", st.Counts, stuck)
		}
		if o := st.OldestInProgress; o == nil || o.Scope != keyOf(key.Tenant, lease, "live-1") {
			t.Errorf("the tenant's oldest in progress: %+v", o)
		}
		// Recorded only: no oldest stuck key; a method; a creation range.
		st, err = a.Stats(t.Context(), store.KeyFilter{AllTenants: true, Method: key.Method, States: []store.State{store.Recorded}})
		if err != nil || len(st.Counts) != 2 || st.OldestInProgress != nil || st.OldestAbandoned != nil {
			t.Errorf("the method's recorded keys: %+v, %v", st, err)
		}
		// Creation times are the store's own (a database's clock, say):
		// [created of abandoned-1, created of live-0) holds abandoned-1.
		from, to := keyInfo(t, a, keyOf(key.Tenant, lease, "abandoned-1")).CreatedAt, keyInfo(t, a, oldLive).CreatedAt
		st, err = a.Stats(t.Context(), store.KeyFilter{AllTenants: true, CreatedAfter: from, CreatedBefore: to})
		if err != nil || len(st.Counts) != 1 || st.Counts[0].Count != 1 || st.Counts[0].State != store.Abandoned {
			t.Errorf("the keys created in [1 s, 2 s): %+v, %v", st, err)
		}
		if _, err := a.Stats(t.Context(), store.KeyFilter{Tenant: "a\x00"}); !errors.Is(err, store.ErrInvalidScope) {
			t.Errorf("Stats of an invalid filter: %v, want ErrInvalidScope", err)
		}
	}},
}

// bulkCases exercise what the admin service's actions on many keys
// (ForgetKeys, SettleKeys) ask of a store: a listing whose cursor goes on
// while the keys of its pages are forgotten or settled.
var bulkCases = []testCase{
	{name: "ActOnEveryKeyWhilePaging", run: func(t *testing.T, s store.Store, cfg Config) {
		a := admin(t, s)
		const lease = "/idem.test.v1.Test/Lease"
		var keys []store.Scope
		for i := range 10 {
			k := keyOf(key.Tenant, lease, fmt.Sprint("k-", i))
			_ = takeLease(t, s, k, fp, shortLease)
			keys = append(keys, k)
			cfg.advance(time.Millisecond)
		}
		recordKey(t, s, keyOf(key.Tenant, lease, "recorded"), okOutcome("r"))
		cfg.advance(runOut)
		f := store.KeyFilter{Tenant: key.Tenant, States: []store.State{store.Abandoned}, Limit: 3}
		seen := map[store.Scope]bool{}
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatal("the pages never end")
			}
			page, next, err := a.Keys(t.Context(), f)
			if err != nil {
				t.Fatalf("Keys after %d pages: %v", pages, err)
			}
			for i, ki := range page {
				if seen[ki.Scope] {
					t.Fatalf("%v listed twice", ki.Scope)
				}
				seen[ki.Scope] = true
				audit := auditBy("bulk", "after the outage")
				if i%2 == 0 {
					err = a.Forget(t.Context(), ki.Scope, store.ForgetOptions{Audit: audit})
				} else {
					err = a.Settle(t.Context(), ki.Scope, settleStatus("cancelled"), store.SettleOptions{Audit: audit})
				}
				if err != nil {
					t.Fatalf("acting on %v: %v", ki.Scope, err)
				}
			}
			if next == "" {
				break
			}
			f.After = next
		}
		if len(seen) != len(keys) {
			t.Errorf("the pages listed %d keys, want the %d abandoned", len(seen), len(keys))
		}
		if got := auditLog(t, a, store.AuditFilter{Tenant: key.Tenant, Method: lease}, 100); len(got) != len(keys) {
			t.Errorf("%d audit entries, want one per key", len(got))
		}
		if st, err := a.Stats(t.Context(), store.KeyFilter{Tenant: key.Tenant, States: []store.State{store.Abandoned}}); err != nil || len(st.Counts) != 0 {
			t.Errorf("abandoned keys left: %+v, %v", st, err)
		}
	}},
}
