package admin_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemkit/idem/admin"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// TestAuditTrail drives the actions over store/memory on each wire: each
// one that changes a key leaves an audit entry naming the operator, the
// reason, the request id and the peer, with the key's states before and
// after, which ListAudit lists by key and by time.
func TestAuditTrail(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		var (
			mu  sync.Mutex
			now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		)
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
		st := memory.New(memory.WithClock(clock))
		client := w.serve(t, st, admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
			return admin.Grant{Subject: "oncall", AllTenants: true}, nil
		}))
		ctx := w.withHeaderOf(t, "x-request-id", "req-42")
		start := now

		k := store.Scope{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-7"}
		if _, err := st.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
		settle := &adminv1.SettleKeyRequest{Tenant: k.Tenant, Method: k.Method, Key: k.Key, Force: true,
			Reason: "the bank refused the charge", Status: &spb.Status{Code: int32(codes.FailedPrecondition), Message: "cancelled"}}
		if _, err := client.SettleKey(ctx, settle); err != nil {
			t.Fatalf("forced settle: %v", err)
		}
		advance(time.Minute)
		if _, err := client.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: k.Tenant, Method: k.Method, Key: k.Key}); err != nil {
			t.Fatalf("forget: %v", err)
		}
		// A refused action leaves no entry.
		_, err := client.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: k.Tenant, Method: k.Method, Key: k.Key, Reason: "again"})
		wantCode(t, err, codes.NotFound)

		hist, err := client.ListAudit(ctx, &adminv1.ListAuditRequest{Tenant: k.Tenant, Method: k.Method, Key: k.Key})
		if err != nil {
			t.Fatal(err)
		}
		es := hist.GetEntries()
		if len(es) != 2 {
			t.Fatalf("the key's history: %v, want the settle and the forget", es)
		}
		for i, want := range []struct {
			action        adminv1.AuditAction
			reason        string
			force         bool
			before, after adminv1.KeyState
			at            time.Time
		}{
			{adminv1.AuditAction_AUDIT_ACTION_SETTLE, "the bank refused the charge", true, adminv1.KeyState_KEY_STATE_IN_PROGRESS, adminv1.KeyState_KEY_STATE_RECORDED, start},
			{adminv1.AuditAction_AUDIT_ACTION_FORGET, "", false, adminv1.KeyState_KEY_STATE_RECORDED, adminv1.KeyState_KEY_STATE_UNSPECIFIED, start.Add(time.Minute)},
		} {
			e := es[i]
			if e.GetAction() != want.action || e.GetReason() != want.reason || e.GetForce() != want.force ||
				e.GetStateBefore() != want.before || e.GetStateAfter() != want.after || !e.GetTime().AsTime().Equal(want.at) ||
				e.GetOperator() != "oncall" || e.GetRequestId() != "req-42" || e.GetPeer() == "" ||
				e.GetTenant() != k.Tenant || e.GetMethod() != k.Method || e.GetKey() != k.Key {
				t.Errorf("entry %d: %v, want %+v by oncall, request req-42, from a peer", i, e, want)
			}
		}
		// By time, over every tenant: [start + 1 s, ...) holds the forget.
		later, err := client.ListAudit(ctx, &adminv1.ListAuditRequest{AllTenants: true, StartTime: timestamp(start.Add(time.Second))})
		if err != nil || len(later.GetEntries()) != 1 || later.GetEntries()[0].GetAction() != adminv1.AuditAction_AUDIT_ACTION_FORGET {
			t.Errorf("the entries after the settle: %v, %v; want the forget", later, err)
		}
		early, err := client.ListAudit(ctx, &adminv1.ListAuditRequest{Tenant: k.Tenant, EndTime: timestamp(start.Add(time.Second))})
		if err != nil || len(early.GetEntries()) != 1 || early.GetEntries()[0].GetAction() != adminv1.AuditAction_AUDIT_ACTION_SETTLE {
			t.Errorf("the entries before the forget: %v, %v; want the settle", early, err)
		}
	})
}

// withHeaderOf returns the test's context with the request header name:
// value on w.
func (w wire) withHeaderOf(t *testing.T, kv ...string) context.Context {
	return w.start(t, admin.NewServer(&fakeStore{}, allowAll)).withHeader(t.Context(), kv...)
}

// TestReasons: a forced action without a reason, or a reason the audit
// trail cannot keep, is INVALID_ARGUMENT before the store is asked; an
// action that is not forced needs none.
func TestReasons(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		held := info("acme", doMethod, "held", store.Abandoned, epoch)
		st := &fakeStore{now: epoch, keys: []store.KeyInfo{held}}
		c := w.serve(t, st, allowAll)
		ctx := t.Context()
		status := &spb.Status{Code: int32(codes.FailedPrecondition)}
		for _, tc := range []struct {
			reason string
			force  bool
			rule   string
		}{
			{"", true, "a forced action needs a reason"},
			{" \t", true, "a forced action needs a reason"},
			{strings.Repeat("r", store.MaxReasonLength+1), false, "reason is 1025 bytes, longer than the 1024 allowed"},
			{"a\x00b", true, "reason contains a NUL byte"},
		} {
			for name, call := range map[string]func() error{
				"forget": func() error {
					_, err := c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: "held", Force: tc.force, Reason: tc.reason})
					return err
				},
				"settle": func() error {
					_, err := c.SettleKey(ctx, &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "held", Force: tc.force, Reason: tc.reason, Status: status})
					return err
				},
			} {
				if msg := wantCode(t, call(), codes.InvalidArgument); !strings.Contains(msg, tc.rule) {
					t.Errorf("%s with reason %q (force %v): %q, want %q", name, tc.reason, tc.force, msg, tc.rule)
				}
			}
		}
		if n := st.storeCalls(); n != 0 {
			t.Errorf("refused reasons reached the store %d times", n)
		}
		if _, err := c.SettleKey(ctx, &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "held", Status: status}); err != nil {
			t.Errorf("an unforced settle without a reason: %v", err)
		}
		if es := st.auditEntries(); len(es) != 1 || es[0].Operator != "root" || es[0].Action != store.ActionSettle {
			t.Errorf("the audit entries: %+v, want the settle by root", es)
		}
	})
}

// TestListAuditScopeAndTokens: ListAudit keeps the tenant scope of
// ListKeys, and its page tokens are signed for its filter: one altered,
// one of another filter, and one of ListKeys are refused.
func TestListAuditScopeAndTokens(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		st := &fakeStore{keys: []store.KeyInfo{info("acme", doMethod, "k1", store.Recorded, epoch), info("acme", doMethod, "k2", store.Recorded, epoch)}}
		for _, tenant := range []string{"acme", "acme", "acme", "globex"} {
			st.audit = append(st.audit, store.AuditEntry{Scope: store.Scope{Tenant: tenant, Method: doMethod, Key: "k1"}, Action: store.ActionForget, Before: store.Recorded})
		}
		c := w.serve(t, st, admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
			return admin.Grant{Subject: "alice", Tenants: []string{"acme"}}, nil
		}))
		ctx := t.Context()
		_, err := c.ListAudit(ctx, &adminv1.ListAuditRequest{Tenant: "globex"})
		wantCode(t, err, codes.PermissionDenied)
		_, err = c.ListAudit(ctx, &adminv1.ListAuditRequest{AllTenants: true})
		wantCode(t, err, codes.PermissionDenied)
		_, err = c.ListAudit(ctx, &adminv1.ListAuditRequest{Tenant: "acme", Key: "k1"})
		wantCode(t, err, codes.InvalidArgument) // a key needs its method

		first, err := c.ListAudit(ctx, &adminv1.ListAuditRequest{Tenant: "acme", PageSize: 1})
		if err != nil || len(first.GetEntries()) != 1 || first.GetNextPageToken() == "" {
			t.Fatalf("first page: %v, %v", first, err)
		}
		var all []*adminv1.AuditEntry
		for tok := ""; ; {
			page, err := c.ListAudit(ctx, &adminv1.ListAuditRequest{Tenant: "acme", PageSize: 2, PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, page.GetEntries()...)
			if tok = page.GetNextPageToken(); tok == "" {
				break
			}
		}
		if len(all) != 3 {
			t.Errorf("acme's entries over the pages: %d, want 3", len(all))
		}
		tok := first.GetNextPageToken()
		keysPage, err := c.ListKeys(ctx, &adminv1.ListKeysRequest{Tenant: "acme", PageSize: 1})
		if err != nil || keysPage.GetNextPageToken() == "" {
			t.Fatalf("ListKeys: %v, %v", keysPage, err)
		}
		for name, req := range map[string]*adminv1.ListAuditRequest{
			"altered":          {Tenant: "acme", PageToken: tok[:len(tok)-2] + "AA"},
			"another method":   {Tenant: "acme", Method: doMethod, PageToken: tok},
			"another start":    {Tenant: "acme", StartTime: timestamp(epoch), PageToken: tok},
			"ListKeys's token": {Tenant: "acme", PageToken: keysPage.GetNextPageToken()},
		} {
			_, err := c.ListAudit(ctx, req)
			wantCode(t, err, codes.InvalidArgument)
			_ = name
		}
		// And ListAudit's token is no ListKeys token.
		_, err = c.ListKeys(ctx, &adminv1.ListKeysRequest{Tenant: "acme", PageToken: tok})
		wantCode(t, err, codes.InvalidArgument)
	})
}

// TestGetKeyStats: the counts and the oldest keys, in the caller's tenant
// scope.
func TestGetKeyStats(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		stuck := info("acme", doMethod, "stuck", store.Abandoned, epoch)
		st := &fakeStore{keys: []store.KeyInfo{
			info("acme", doMethod, "k1", store.Recorded, epoch), info("acme", doMethod, "k2", store.Recorded, epoch),
			stuck, info("globex", doMethod, "k3", store.Recorded, epoch),
		}}
		c := w.serve(t, st, admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
			return admin.Grant{Subject: "alice", Tenants: []string{"acme"}}, nil
		}))
		ctx := t.Context()
		resp, err := c.GetKeyStats(ctx, &adminv1.GetKeyStatsRequest{Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, n := range resp.GetCounts() {
			got = append(got, n.GetTenant()+" "+n.GetMethod()+" "+n.GetState().String()+" "+string(rune('0'+n.GetCount())))
		}
		want := []string{"acme " + doMethod + " KEY_STATE_RECORDED 2", "acme " + doMethod + " KEY_STATE_ABANDONED 1"}
		if !slices.Equal(got, want) {
			t.Errorf("counts: %q, want %q", got, want)
		}
		if resp.GetOldestAbandoned().GetKey() != "stuck" || resp.GetOldestInProgress() != nil {
			t.Errorf("oldest: %v, %v; want the stuck key abandoned and none in progress", resp.GetOldestAbandoned(), resp.GetOldestInProgress())
		}
		_, err = c.GetKeyStats(ctx, &adminv1.GetKeyStatsRequest{AllTenants: true})
		wantCode(t, err, codes.PermissionDenied)
		_, err = c.GetKeyStats(ctx, &adminv1.GetKeyStatsRequest{Tenant: "globex"})
		wantCode(t, err, codes.PermissionDenied)
		_, err = c.GetKeyStats(ctx, &adminv1.GetKeyStatsRequest{Tenant: "acme", Method: "/a\x00"})
		wantCode(t, err, codes.InvalidArgument)
	})
}

// TestReadOnlyGrant calls every method of the service, as its descriptor
// lists them, on every wire, with a read-only grant: each RPC without side
// effects reaches the store, and every other is refused PERMISSION_DENIED
// before it does. A new RPC that acts is refused to read-only operators
// unless its descriptor says it has no side effects.
func TestReadOnlyGrant(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		st := &fakeStore{keys: []store.KeyInfo{info("acme", doMethod, "k1", store.Abandoned, epoch)}}
		c := w.serve(t, st, admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
			return admin.Grant{Subject: "viewer", AllTenants: true, ReadOnly: true}, nil
		}))
		sd := adminv1.File_idem_admin_v1_admin_proto.Services().ByName("AdminService")
		methods := sd.Methods()
		var reads []string
		for i := range methods.Len() {
			md := methods.Get(i)
			full := "/" + string(sd.FullName()) + "/" + string(md.Name())
			opts, _ := md.Options().(*descriptorpb.MethodOptions)
			readOnly := opts.GetIdempotencyLevel() == descriptorpb.MethodOptions_NO_SIDE_EFFECTS
			if admin.ReadOnlyMethod(full) != readOnly {
				t.Errorf("ReadOnlyMethod(%s) = %v, but its descriptor says %v", full, !readOnly, opts.GetIdempotencyLevel())
			}
			before := st.storeCalls()
			err := c.invoke(t.Context(), full, actionRequest(md.Input()))
			if readOnly {
				reads = append(reads, string(md.Name()))
				if code, msg := codeOf(err); code == codes.PermissionDenied || st.storeCalls() == before {
					t.Errorf("%s, read-only: %v %q, %d store calls; want it to reach the store", full, code, msg, st.storeCalls()-before)
				}
				continue
			}
			if msg := wantCode(t, err, codes.PermissionDenied); !strings.Contains(msg, "read-only") {
				t.Errorf("%s: %q, want it to say the grant is read-only", full, msg)
			}
			if st.storeCalls() != before {
				t.Errorf("%s: a read-only operator's action reached the store", full)
			}
		}
		if want := []string{"ListKeys", "GetKey", "ListAudit", "GetKeyStats"}; !slices.Equal(reads, want) {
			t.Errorf("the read-only RPCs: %q, want %q", reads, want)
		}
		if len(st.keys) != 1 || len(st.auditEntries()) != 0 {
			t.Errorf("a read-only operator changed the store: %d keys, %d audit entries", len(st.keys), len(st.auditEntries()))
		}
	})
}

// actionRequest returns a request of d that names key k1 of tenant acme,
// with a reason and a status to settle with, where d has those fields:
// one that reaches the store unless the service refuses it.
func actionRequest(d protoreflect.MessageDescriptor) *dynamicpb.Message {
	m := filled(d)
	if fd := d.Fields().ByName("reason"); fd != nil {
		m.Set(fd, protoreflect.ValueOfString("checked by hand"))
	}
	if fd := d.Fields().ByName("status"); fd != nil {
		st := dynamicpb.NewMessage(fd.Message())
		st.Set(fd.Message().Fields().ByName("code"), protoreflect.ValueOfInt32(int32(codes.FailedPrecondition)))
		m.Set(fd, protoreflect.ValueOfMessage(st))
	}
	return m
}

// TestStoreErrorHiddenOnEveryRPC calls every method of the service, as its
// descriptor lists them, on every wire, over a store whose every call
// fails with SQL in its error: no answer carries the store's text, which
// reaches the log. A new RPC that answers with its store's error fails
// here.
func TestStoreErrorHiddenOnEveryRPC(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		st := &fakeStore{err: errors.New(`ERROR: canceling statement (SQLSTATE 57014) in SELECT state FROM idempotency_keys WHERE tenant = $1`)}
		var logs lockedBuffer
		c := w.serve(t, st, allowAll, admin.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		sd := adminv1.File_idem_admin_v1_admin_proto.Services().ByName("AdminService")
		methods := sd.Methods()
		for i := range methods.Len() {
			md := methods.Get(i)
			full := "/" + string(sd.FullName()) + "/" + string(md.Name())
			for _, in := range []*dynamicpb.Message{actionRequest(md.Input()), filled(md.Input())} {
				err := c.invoke(t.Context(), full, in)
				got, msg := codeOf(err)
				if got == codes.OK {
					t.Errorf("%s over a failing store answered OK", full)
				}
				for _, leak := range []string{"SELECT", "SQLSTATE", "idempotency_keys", "57014"} {
					if strings.Contains(msg, leak) {
						t.Errorf("%s: the client saw %q", full, msg)
					}
				}
			}
		}
		if !strings.Contains(logs.String(), "SELECT state FROM idempotency_keys") {
			t.Errorf("the store's error was not logged: %s", logs.String())
		}
	})
}

// TestAuditOfAnOddSubject: a grant's subject, a request id or a peer that
// an audit entry cannot hold as they are (too long, not UTF-8, a NUL
// byte) are made to fit, and never fail the action.
func TestAuditOfAnOddSubject(t *testing.T) {
	st := &fakeStore{keys: []store.KeyInfo{info("acme", doMethod, "k1", store.Recorded, epoch)}}
	odd := strings.Repeat("é", 200) + "\x00bad-\xff"
	srv := admin.NewServer(st, admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
		return admin.Grant{Subject: odd, AllTenants: true}, nil
	}))
	if _, err := srv.ForgetKey(t.Context(), &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: "k1", Reason: "r"}); err != nil {
		t.Fatalf("ForgetKey by an odd subject: %v", err)
	}
	es := st.auditEntries()
	if len(es) != 1 {
		t.Fatalf("audit entries: %+v", es)
	}
	e := es[0]
	e.Action, e.Scope, e.Before = store.ActionForget, store.Scope{Tenant: "acme", Method: doMethod, Key: "k1"}, store.Recorded
	if err := e.Validate(); err != nil || len(e.Operator) > store.MaxAuditFieldLength || !strings.HasPrefix(e.Operator, "éé") {
		t.Errorf("the entry's operator %q: %v; want it cut to fit", e.Operator, err)
	}
}
