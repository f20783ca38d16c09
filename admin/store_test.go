package admin_test

import (
	"context"
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

// TestOnMemoryStore drives the service over store/memory, the store of
// idem's own rather than a fake: a leased call is abandoned, an operator
// finds it, is refused a settle while its lease is live, settles it once
// the lease has run out, and its retry replays the settled error; a
// forgotten key runs afresh.
func TestOnMemoryStore(t *testing.T) {
	onEachWire(t, testOnMemoryStore)
}

func testOnMemoryStore(t *testing.T, w wire) {
	var (
		mu  sync.Mutex
		now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	st := memory.New(memory.WithClock(clock))
	all := admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
		return admin.Grant{Subject: "oncall", AllTenants: true}, nil
	})
	client := w.serve(t, st, all)
	ctx := t.Context()

	k := store.Scope{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-7"}
	lc, err := st.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease: %+v, %v", lc, err)
	}

	list, err := client.ListKeys(ctx, &adminv1.ListKeysRequest{Tenant: "acme"})
	if err != nil || len(list.GetKeys()) != 1 || list.GetKeys()[0].GetState() != adminv1.KeyState_KEY_STATE_IN_PROGRESS {
		t.Fatalf("ListKeys: %v, %v; want the one key, in progress", list, err)
	}
	settle := &adminv1.SettleKeyRequest{Tenant: k.Tenant, Method: k.Method, Key: k.Key,
		Status: &spb.Status{Code: int32(codes.FailedPrecondition), Message: "cancelled by an operator"}}
	_, err = client.SettleKey(ctx, settle)
	if msg := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(msg, "2026-01-02T03:05:05") {
		t.Fatalf("settle of a live lease: %q, want the lease's end named", msg)
	}

	advance(2 * time.Minute) // the caller is gone: the lease runs out
	got, err := client.GetKey(ctx, &adminv1.GetKeyRequest{Tenant: k.Tenant, Method: k.Method, Key: k.Key})
	if err != nil || got.GetKey().GetState() != adminv1.KeyState_KEY_STATE_ABANDONED {
		t.Fatalf("GetKey: %v, %v; want it abandoned", got, err)
	}
	if _, err := client.SettleKey(ctx, settle); err != nil {
		t.Fatalf("settle of the abandoned key: %v", err)
	}
	c, err := st.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Entry == nil || c.Entry.State != store.Recorded || c.Entry.Outcome.Code != 9 {
		t.Fatalf("retry after the settle: %+v, %v; want the settled FAILED_PRECONDITION replayed", c, err)
	}
	// The settled call's holder is fenced.
	if err := lc.Lease.Extend(ctx, time.Minute); err == nil {
		t.Fatal("the settled lease's holder extended it")
	}

	if _, err := client.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: k.Tenant, Method: k.Method, Key: k.Key}); err != nil {
		t.Fatalf("forget: %v", err)
	}
	c, err = st.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("retry after the forget: %+v, %v; want it to run afresh", c, err)
	}
	_ = c.Txn.Release(ctx)
	_, err = client.GetKey(ctx, &adminv1.GetKeyRequest{Tenant: k.Tenant, Method: k.Method, Key: k.Key})
	wantCode(t, err, codes.NotFound)
}
