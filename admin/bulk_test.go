package admin_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem/admin"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// bulkFixture is store/memory with, in tenant acme, five abandoned
// leases, two live ones and a recorded key, and a key of tenant globex,
// served to an operator granted acme only.
type bulkFixture struct {
	st      *memory.Store
	client  client
	live    []store.Lease
	advance func(time.Duration)
}

const checkoutMethod = "/shop.v1.Shop/Checkout"

func newBulkFixture(t *testing.T, w wire) *bulkFixture {
	t.Helper()
	var (
		mu  sync.Mutex
		now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	)
	f := &bulkFixture{advance: func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }}
	f.st = memory.New(memory.WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	ctx := t.Context()
	lease := func(tenant, key string, d time.Duration) store.Lease {
		t.Helper()
		lc, err := f.st.ClaimLeased(ctx, store.Scope{Tenant: tenant, Method: checkoutMethod, Key: key}, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: d})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease %s: %+v, %v", key, lc, err)
		}
		f.advance(time.Second)
		return lc.Lease
	}
	for i := range 5 {
		lease("acme", fmt.Sprint("abandoned-", i), time.Second)
	}
	for i := range 2 {
		f.live = append(f.live, lease("acme", fmt.Sprint("live-", i), time.Hour))
	}
	lease("globex", "theirs", time.Second)
	c, err := f.st.Claim(ctx, store.Scope{Tenant: "acme", Method: checkoutMethod, Key: "recorded"}, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatal(c, err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: 0, Body: []byte{}}); err != nil {
		t.Fatal(err)
	}
	f.client = w.serve(t, f.st, admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
		return admin.Grant{Subject: "alice", Tenants: []string{"acme"}}, nil
	}))
	return f
}

func (f *bulkFixture) auditCount(t *testing.T) int {
	t.Helper()
	list, _, err := f.st.AuditLog(t.Context(), store.AuditFilter{AllTenants: true, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// stuck selects acme's keys in progress and abandoned.
var stuck = &adminv1.KeySelection{Tenant: "acme",
	States: []adminv1.KeyState{adminv1.KeyState_KEY_STATE_IN_PROGRESS, adminv1.KeyState_KEY_STATE_ABANDONED}}

// TestForgetKeys: a dry run counts and samples and changes nothing; the
// action, a page at a time, forgets the abandoned keys and skips the live
// leases, saying why, each forget in the audit trail with the reason; a
// forced one forgets the live leases too, fencing their holders.
func TestForgetKeys(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		f := newBulkFixture(t, w)
		ctx := t.Context()
		dry, err := f.client.ForgetKeys(ctx, &adminv1.ForgetKeysRequest{Selection: stuck, Limit: 3, DryRun: true, Reason: "outage of 2 Jan"})
		if b := dry.GetBatch(); err != nil || b.GetCount() != 7 || len(b.GetSample()) != 3 || b.GetSample()[0].GetKey() != "abandoned-0" || len(b.GetResults()) != 0 {
			t.Fatalf("dry run: %v, %v; want a count of 7 and a sample of 3", dry, err)
		}
		if n := f.auditCount(t); n != 0 {
			t.Fatalf("a dry run left %d audit entries", n)
		}
		if _, err := f.st.Key(ctx, store.Scope{Tenant: "acme", Method: checkoutMethod, Key: "abandoned-0"}); err != nil {
			t.Fatalf("a dry run forgot a key: %v", err)
		}

		var done, skipped []string
		pages := 0
		for token := ""; ; pages++ {
			resp, err := f.client.ForgetKeys(ctx, &adminv1.ForgetKeysRequest{Selection: stuck, Limit: 3, Reason: "outage of 2 Jan", PageToken: token})
			if err != nil {
				t.Fatalf("ForgetKeys: %v", err)
			}
			for _, r := range resp.GetBatch().GetResults() {
				switch r.GetOutcome() {
				case adminv1.KeyResult_OUTCOME_DONE:
					done = append(done, r.GetKey())
				case adminv1.KeyResult_OUTCOME_SKIPPED:
					skipped = append(skipped, r.GetKey())
					if r.GetStatus().GetCode() != int32(codes.FailedPrecondition) || !strings.Contains(r.GetStatus().GetMessage(), "lease is live") {
						t.Errorf("%s skipped with %v, want the live lease named", r.GetKey(), r.GetStatus())
					}
				}
			}
			if token = resp.GetBatch().GetNextPageToken(); token == "" {
				break
			}
		}
		if len(done) != 5 || len(skipped) != 2 || pages != 2 {
			t.Fatalf("forgot %q and skipped %q in %d pages; want the 5 abandoned forgotten and the 2 live skipped, in 3 pages", done, skipped, pages+1)
		}
		hist, _, err := f.st.AuditLog(ctx, store.AuditFilter{Tenant: "acme", Method: checkoutMethod, Key: "abandoned-3"})
		if err != nil || len(hist) != 1 || hist[0].Reason != "outage of 2 Jan" || hist[0].Operator != "alice" || hist[0].Before != store.Abandoned {
			t.Fatalf("abandoned-3's history: %+v, %v", hist, err)
		}
		if n := f.auditCount(t); n != 5 {
			t.Errorf("%d audit entries, want one per key forgotten", n)
		}

		// Forced: the live leases go, their holders fenced.
		resp, err := f.client.ForgetKeys(ctx, &adminv1.ForgetKeysRequest{Selection: stuck, Limit: 10, Force: true, Reason: "stuck handlers"})
		if err != nil || len(resp.GetBatch().GetResults()) != 2 || resp.GetBatch().GetResults()[0].GetOutcome() != adminv1.KeyResult_OUTCOME_DONE {
			t.Fatalf("forced ForgetKeys: %v, %v", resp, err)
		}
		for i, l := range f.live {
			if err := l.Extend(ctx, time.Minute); err == nil {
				t.Errorf("live-%d's holder extended its lease after a forced ForgetKeys", i)
			}
		}
		if _, err := f.st.Key(ctx, store.Scope{Tenant: "globex", Method: checkoutMethod, Key: "theirs"}); err != nil {
			t.Errorf("another tenant's key: %v", err)
		}
		if _, err := f.st.Key(ctx, store.Scope{Tenant: "acme", Method: checkoutMethod, Key: "recorded"}); err != nil {
			t.Errorf("a key outside the selection: %v", err)
		}
	})
}

// TestBulkRules: the rules every RPC on many keys keeps: a required limit
// and reason, the tenant scope, and page tokens signed for the RPC and
// its selection.
func TestBulkRules(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		f := newBulkFixture(t, w)
		ctx := t.Context()
		status := &spb.Status{Code: int32(codes.FailedPrecondition), Message: "cancelled"}
		for name, req := range map[string]*adminv1.ForgetKeysRequest{
			"no limit":          {Selection: stuck, Reason: "r"},
			"a limit past 1000": {Selection: stuck, Limit: 1001, Reason: "r"},
			"no reason":         {Selection: stuck, Limit: 10},
			"a blank reason":    {Selection: stuck, Limit: 10, Reason: "  "},
			"a long reason":     {Selection: stuck, Limit: 10, Reason: strings.Repeat("r", 1025)},
			"a bad state":       {Selection: &adminv1.KeySelection{Tenant: "acme", States: []adminv1.KeyState{0}}, Limit: 10, Reason: "r"},
			"a bad token":       {Selection: stuck, Limit: 10, Reason: "r", PageToken: "nope"},
		} {
			_, err := f.client.ForgetKeys(ctx, req)
			if got, msg := codeOf(err); got != codes.InvalidArgument {
				t.Errorf("%s: %v %q, want INVALID_ARGUMENT", name, got, msg)
			}
		}
		_, err := f.client.SettleKeys(ctx, &adminv1.SettleKeysRequest{Selection: stuck, Limit: 10, Reason: "r", Status: &spb.Status{Code: int32(codes.Unavailable)}})
		wantCode(t, err, codes.InvalidArgument)
		for _, sel := range []*adminv1.KeySelection{{Tenant: "globex"}, {AllTenants: true}} {
			_, err := f.client.ForgetKeys(ctx, &adminv1.ForgetKeysRequest{Selection: sel, Limit: 10, Force: true, Reason: "r"})
			wantCode(t, err, codes.PermissionDenied)
			_, err = f.client.SettleKeys(ctx, &adminv1.SettleKeysRequest{Selection: sel, Limit: 10, Reason: "r", Status: status})
			wantCode(t, err, codes.PermissionDenied)
		}
		if n := f.auditCount(t); n != 0 {
			t.Fatalf("refused calls left %d audit entries", n)
		}

		// A token is for its RPC and its selection.
		resp, err := f.client.SettleKeys(ctx, &adminv1.SettleKeysRequest{Selection: stuck, Limit: 1, Reason: "r", Status: status})
		tok := resp.GetBatch().GetNextPageToken()
		if err != nil || tok == "" {
			t.Fatalf("SettleKeys of 1: %v, %v", resp, err)
		}
		_, err = f.client.ForgetKeys(ctx, &adminv1.ForgetKeysRequest{Selection: stuck, Limit: 1, Reason: "r", PageToken: tok})
		wantCode(t, err, codes.InvalidArgument)
		_, err = f.client.SettleKeys(ctx, &adminv1.SettleKeysRequest{Selection: &adminv1.KeySelection{Tenant: "acme"}, Limit: 1, Reason: "r", Status: status, PageToken: tok})
		wantCode(t, err, codes.InvalidArgument)
		_, err = f.client.ListKeys(ctx, &adminv1.ListKeysRequest{Tenant: "acme", States: stuck.GetStates(), PageToken: tok})
		wantCode(t, err, codes.InvalidArgument)
		if _, err := f.client.SettleKeys(ctx, &adminv1.SettleKeysRequest{Selection: stuck, Limit: 1, Reason: "r", Status: status, PageToken: tok}); err != nil {
			t.Errorf("SettleKeys with its own token: %v", err)
		}
	})
}

// TestSettleKeys: the abandoned keys are settled, and their retries
// replay the error; a live lease is skipped unless forced; a recorded key
// is skipped, saying so.
func TestSettleKeys(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		f := newBulkFixture(t, w)
		ctx := t.Context()
		status := &spb.Status{Code: int32(codes.FailedPrecondition), Message: "cancelled by an operator"}
		all := &adminv1.KeySelection{Tenant: "acme"}
		resp, err := f.client.SettleKeys(ctx, &adminv1.SettleKeysRequest{Selection: all, Limit: 100, Reason: "outage", Status: status})
		if err != nil {
			t.Fatal(err)
		}
		outcomes := map[string]string{}
		for _, r := range resp.GetBatch().GetResults() {
			outcomes[r.GetKey()] = r.GetOutcome().String() + " " + r.GetStatus().GetMessage()
		}
		for key, want := range map[string]string{
			"abandoned-0": "OUTCOME_DONE", "abandoned-4": "OUTCOME_DONE",
			"live-0": "lease is live", "recorded": "recorded already",
		} {
			if !strings.Contains(outcomes[key], want) {
				t.Errorf("%s: %q, want %q", key, outcomes[key], want)
			}
		}
		c, err := f.st.Claim(ctx, store.Scope{Tenant: "acme", Method: checkoutMethod, Key: "abandoned-2"}, store.ClaimRequest{Fingerprint: []byte("fp")})
		if err != nil || c.Entry == nil || c.Entry.State != store.Recorded || c.Entry.Outcome.Code != 9 {
			t.Fatalf("retry of a settled key: %+v, %v; want the settled error replayed", c, err)
		}
		if n := f.auditCount(t); n != 5 {
			t.Errorf("%d audit entries, want one per key settled", n)
		}
	})
}
