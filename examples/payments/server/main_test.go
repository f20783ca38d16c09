package main

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// TestServer starts the server on a loopback port, checks health, makes a
// keyed call and its retry, and stops it by ending the context.
func TestServer(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, lis, nil, dsn) }()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, callCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer callCancel()
	health, err := healthpb.NewHealthClient(conn).Check(callCtx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || health.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", health, err)
	}

	client := paymentsv1.NewPaymentServiceClient(conn)
	keyed := metadata.AppendToOutgoingContext(callCtx, interceptor.KeyHeader, "k", "x-tenant-id", "acme")
	req := &paymentsv1.CreatePaymentRequest{CustomerId: "c", AmountCents: 1, Currency: "EUR"}
	first, err := client.CreatePayment(keyed, req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.CreatePayment(keyed, req)
	if err != nil || again.GetPayment().GetId() != first.GetPayment().GetId() {
		t.Fatalf("retry: %v, %v; want payment %s", again, err, first.GetPayment().GetId())
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("server did not stop after its context ended")
	}
}
