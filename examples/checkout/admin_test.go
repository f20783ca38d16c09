package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	"github.com/idemkit/idem/examples/internal/adminlisten"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/internal/admingrpc"
)

// TestAdminFinishKey serves the admin service as -admin-listen does, and
// its console as -console-listen does, and finishes an abandoned checkout
// with FinishKey, from the console's form, at once, with no replica
// running a finisher: without the operator token ListKeys is
// UNAUTHENTICATED; with it, it lists the checkout; FinishKey is refused
// while the lease is live, naming its end, and once the lease has run out
// finishes the checkout after its saved steps, answering with the recorded
// response; every side effect exists once, and the client's retry gets the
// answer replayed.
func TestAdminFinishKey(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	t.Parallel()
	s, ctx := newSystem(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	consoleLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop, err := s.serveAdmin(lis, consoleLis, "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := admingrpc.NewClient(conn)
	operator := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")

	// The client's replica dies once the charge step is saved; the client
	// gives up, and no replica runs a finisher.
	a, err := s.startReplica(ctx, "A", replicaConfig{crashAt: runnerCall + ":" + checkoutsvc.StepCharge, grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key := newKey()
	if _, _, err := checkout(ctx, a, key); err == nil {
		t.Fatal("the checkout on the dying replica succeeded")
	}
	_ = a.wait(ctx)

	if _, err := client.ListKeys(ctx, &adminv1.ListKeysRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListKeys without the operator token: %v, want UNAUTHENTICATED", err)
	}
	list, err := client.ListKeys(operator, &adminv1.ListKeysRequest{})
	if err != nil || len(list.GetKeys()) != 1 || list.GetKeys()[0].GetKey() != key || !list.GetKeys()[0].GetFinishable() {
		t.Fatalf("ListKeys: %v, %v; want the checkout, finishable", list, err)
	}
	k := list.GetKeys()[0]
	req := &adminv1.FinishKeyRequest{Tenant: k.GetTenant(), Method: k.GetMethod(), Key: k.GetKey()}

	// Hold the lease an hour, whatever the proto's lease: FinishKey waits
	// for it to run out.
	if _, err := s.checkoutDB.Exec(ctx, `UPDATE idempotency_keys SET locked_until = date_trunc('second', now()) + interval '1 hour' WHERE key = $1`, key); err != nil {
		t.Fatal(err)
	}
	got, err := client.GetKey(operator, &adminv1.GetKeyRequest{Tenant: k.GetTenant(), Method: k.GetMethod(), Key: k.GetKey()})
	if err != nil {
		t.Fatal(err)
	}
	until := got.GetKey().GetLeaseExpireTime().AsTime().UTC().Format(time.RFC3339Nano)
	_, err = client.FinishKey(operator, req)
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), until) {
		t.Fatalf("FinishKey of a live lease: %v, want FAILED_PRECONDITION naming %s", err, until)
	}

	// The same refusal on the console, as a page naming the lease's end.
	finish := func() (int, string) {
		t.Helper()
		form := url.Values{"tenant": {k.GetTenant()}, "method": {k.GetMethod()}, "key": {k.GetKey()}, "reason": {"INC-12: the replica died after the charge"}}
		hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+consoleLis.Addr().String()+adminlisten.ConsolePath+"finish", strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		hreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		hreq.SetBasicAuth("operator", "s3cret")
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	if code, body := finish(); code != http.StatusConflict || !strings.Contains(body, until) {
		t.Fatalf("the console's finish of a live lease: %d, want 409 naming %s\n%s", code, until, body)
	}

	// The lease runs out: FinishKey finishes the checkout now, from the
	// console as over gRPC.
	if _, err := s.checkoutDB.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE key = $1`, key); err != nil {
		t.Fatal(err)
	}
	if code, body := finish(); code != http.StatusSeeOther {
		t.Fatalf("the console's finish: %d\n%s", code, body)
	}
	fin, err := client.GetKey(operator, &adminv1.GetKeyRequest{Tenant: k.GetTenant(), Method: k.GetMethod(), Key: k.GetKey()})
	if err != nil {
		t.Fatalf("GetKey: %v", err)
	}
	r, err := s.rows(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.once(1) {
		t.Error(f)
	}
	out := fin.GetKey().GetOutcome()
	if fin.GetKey().GetState() != adminv1.KeyState_KEY_STATE_RECORDED || out.GetCode() != 0 ||
		out.GetResponse().GetStructValue().GetFields()["orderId"].GetStringValue() != r.orderID {
		t.Errorf("the finished key is %v; want it recorded with a response naming order %s", fin, r.orderID)
	}
	audit, err := client.ListAudit(operator, &adminv1.ListAuditRequest{Tenant: k.GetTenant(), Method: k.GetMethod(), Key: k.GetKey()})
	if err != nil || len(audit.GetEntries()) != 1 || audit.GetEntries()[0].GetAction() != adminv1.AuditAction_AUDIT_ACTION_FINISH ||
		audit.GetEntries()[0].GetReason() != "INC-12: the replica died after the charge" || audit.GetEntries()[0].GetOperator() != "operator-token" {
		t.Errorf("the key's audit trail: %v, %v; want the console's finish, with its reason", audit, err)
	}
	if _, err := client.FinishKey(operator, req); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("FinishKey of the finished key: %v, want FAILED_PRECONDITION", err)
	}

	late, err := s.retryLater(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range late.broken(r) {
		t.Error(f)
	}
}

// TestAdminListenNeedsToken: without an operator token the demo refuses to
// serve the admin service, before it starts anything.
func TestAdminListenNeedsToken(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err = runAdmin(t.Context(), &out, &out, adminFlags{lis: lis, until: t.Context()})
	if !errors.Is(err, adminlisten.ErrNoToken) || out.Len() != 0 {
		t.Fatalf("runAdmin without a token: %v, output %q; want ErrNoToken and nothing run", err, out.String())
	}
}
