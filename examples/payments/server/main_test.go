package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// TestServer starts the server on a loopback port, checks health, makes a
// keyed call and its retry, reads the metrics that count them, and stops
// it by ending the context: in CreatePayment's own mode, and with -mode
// auto, which the metrics' idem_mode must show.
func TestServer(t *testing.T) {
	for _, c := range []struct {
		mode idem.Mode
		want string
	}{{"", "atomic"}, {idem.ModeAuto, "auto"}} {
		t.Run(c.want, func(t *testing.T) { testServer(t, c.mode, c.want) })
	}
}

func testServer(t *testing.T, mode idem.Mode, wantMode string) {
	dsn := pgtest.NewDatabase(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, lis, nil, metricsLis, nil, mode, dsn) }()

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
	keyed := metadata.AppendToOutgoingContext(callCtx, idem.KeyHeader, "k", "x-tenant-id", "acme")
	req := &paymentsv1.CreatePaymentRequest{CustomerId: "c", AmountCents: 1, Currency: "EUR"}
	first, err := client.CreatePayment(metadata.AppendToOutgoingContext(keyed, idem.AttemptHeader, "1"), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.CreatePayment(metadata.AppendToOutgoingContext(keyed, idem.AttemptHeader, "2"), req)
	if err != nil || again.GetPayment().GetId() != first.GetPayment().GetId() {
		t.Fatalf("retry: %v, %v; want payment %s", again, err, first.GetPayment().GetId())
	}

	// The metrics count one execution and one replay.
	metrics := get(t, "http://"+metricsLis.Addr().String()+"/metrics")
	for _, result := range []string{"executed", "replayed"} {
		if v := sample(metrics, "idem_server_requests_total", `idem_result="`+result+`"`, `idem_mode="`+wantMode+`"`, `rpc_method="payments.v1.PaymentService/CreatePayment"`); v != "1" {
			t.Errorf("idem_server_requests_total{idem_result=%q,idem_mode=%q} = %q, want 1; metrics:\n%s", result, wantMode, v, metrics)
		}
	}
	if !strings.Contains(metrics, "idem_claim_duration_seconds_bucket{") {
		t.Errorf("no idem_claim_duration_seconds histogram; metrics:\n%s", metrics)
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

// get returns the body of url.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(body)
}

// sample returns the value of the sample of metric whose labels include
// every one of labels, in the Prometheus text format text, or "" if there
// is none.
func sample(text, metric string, labels ...string) string {
	for line := range strings.Lines(text) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), "{")
		if !ok || name != metric {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(","+set+",", ","+l+",")
		}
		if all {
			return value
		}
	}
	return ""
}
