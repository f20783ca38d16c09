package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/internal/adminlisten"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/internal/admingrpc"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestAdminListener starts the server with the admin service on a
// listener of its own: without the operator token, or with another, it
// answers UNAUTHENTICATED; with it, ListKeys lists the key of a payment
// just made, and the admin calls are counted in the metrics.
func TestAdminListener(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	lis, metricsLis, adminLis := listen(t), listen(t), listen(t)
	serveAdmin(t, lis, nil, metricsLis, &adminConfig{lis: adminLis, token: "s3cret"}, dsn)

	callCtx, callCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer callCancel()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	keyed := metadata.AppendToOutgoingContext(callCtx, idem.KeyHeader, "order-1", "x-tenant-id", "acme")
	if _, err := paymentsv1.NewPaymentServiceClient(conn).CreatePayment(keyed,
		&paymentsv1.CreatePaymentRequest{CustomerId: "c", AmountCents: 1, Currency: "EUR"}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}

	adminConn, err := grpc.NewClient(adminLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer adminConn.Close()
	health, err := healthpb.NewHealthClient(adminConn).Check(callCtx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || health.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("admin listener's health: %v, %v", health, err)
	}
	client := admingrpc.NewClient(adminConn)
	list := &adminv1.ListKeysRequest{Tenant: "acme"}
	for name, ctx := range map[string]context.Context{
		"no token":    callCtx,
		"other token": metadata.AppendToOutgoingContext(callCtx, "authorization", "Bearer guess"),
		"not bearer":  metadata.AppendToOutgoingContext(callCtx, "authorization", "s3cret"),
	} {
		if _, err := client.ListKeys(ctx, list); status.Code(err) != codes.Unauthenticated {
			t.Errorf("ListKeys with %s: %v, want UNAUTHENTICATED", name, err)
		}
	}
	operator := metadata.AppendToOutgoingContext(callCtx, "authorization", "Bearer s3cret")
	keys, err := client.ListKeys(operator, list)
	if err != nil || len(keys.GetKeys()) != 1 || keys.GetKeys()[0].GetKey() != "order-1" {
		t.Fatalf("ListKeys with the operator token: %v, %v; want order-1", keys, err)
	}
	// The payments server runs in atomic mode, with no finisher.
	_, err = client.FinishKey(operator, &adminv1.FinishKeyRequest{Tenant: "acme", Method: "/payments.v1.PaymentService/CreatePayment", Key: "order-1"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("FinishKey: %v, want UNIMPLEMENTED", err)
	}

	// otelgrpc counts the admin calls, refused ones included, in the
	// server's metrics. It counts a call once its handler has returned,
	// which may be after the client has its answer: the metrics are read
	// until they hold every call, for at most 30 s.
	counted := func() (missing string) {
		metrics := get(t, "http://"+metricsLis.Addr().String()+"/metrics")
		for code, want := range map[string]string{"OK": "1", "UNAUTHENTICATED": "3"} {
			if v := sample(metrics, "rpc_server_call_duration_seconds_count",
				`rpc_method="idem.admin.v1.AdminService/ListKeys"`, `rpc_response_status_code="`+code+`"`); v != want {
				return fmt.Sprintf("ListKeys calls answered %s in the metrics: %q, want %s; metrics:\n%s", code, v, want, metrics)
			}
		}
		return ""
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); ; <-tick.C {
		missing := counted()
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(missing)
		}
	}
}

// TestAdminListenerNeedsToken: without an operator token the server
// refuses to start, rather than serve the admin service to anyone.
func TestAdminListenerNeedsToken(t *testing.T) {
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	err := run(t.Context(), listen(), nil, nil, &adminConfig{lis: listen()}, "", "postgres://unused.invalid/none")
	if !errors.Is(err, adminlisten.ErrNoToken) {
		t.Fatalf("run without a token: %v, want ErrNoToken", err)
	}
}
