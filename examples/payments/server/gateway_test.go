package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/internal/pgtest"
)

// gatewayServer runs the server with -http-listen: gRPC and HTTP/JSON on
// loopback ports, on a database of its own.
type gatewayServer struct {
	dsn      string
	grpcAddr string
	httpURL  string
	pool     *pgxpool.Pool
}

func startGatewayServer(t *testing.T) *gatewayServer {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, lis, httpLis, nil, dsn)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &gatewayServer{dsn: dsn, grpcAddr: lis.Addr().String(), httpURL: "http://" + httpLis.Addr().String(), pool: pool}
	s.waitReady(t)
	return s
}

// waitReady waits until the server has created its tables and serves
// HTTP: the listener accepts before then.
func (s *gatewayServer) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.httpURL + "/v1/payments/0")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not answer within 30 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// curlArgs splits a curl command as the README shows it: words, 'quoted
// words' and backslash-newline continuations.
func curlArgs(cmd string) []string {
	cmd = strings.ReplaceAll(cmd, "\\\n", " ")
	var args []string
	for cmd = strings.TrimSpace(cmd); cmd != ""; cmd = strings.TrimSpace(cmd) {
		if cmd[0] == '\'' {
			end := strings.IndexByte(cmd[1:], '\'') + 1
			args = append(args, cmd[1:end])
			cmd = cmd[end+1:]
			continue
		}
		end := strings.IndexAny(cmd, " \t\n")
		if end < 0 {
			end = len(cmd)
		}
		args = append(args, cmd[:end])
		cmd = cmd[end:]
	}
	return args
}

// curl plays a curl command of the README (curl -i URL [-H 'header']...
// [-d 'body']) against base instead of the README's address.
func curl(t *testing.T, base, cmd string) (*http.Response, []byte) {
	t.Helper()
	args := curlArgs(cmd)
	if len(args) < 3 || args[0] != "curl" || args[1] != "-i" {
		t.Fatalf("not a curl -i command: %q", cmd)
	}
	url := strings.Replace(args[2], "http://127.0.0.1:8080", base, 1)
	method, body := http.MethodGet, ""
	header := http.Header{}
	for i := 3; i+1 < len(args); i += 2 {
		switch args[i] {
		case "-H":
			name, value, _ := strings.Cut(args[i+1], ": ")
			header.Add(name, value)
		case "-d":
			method, body = http.MethodPost, args[i+1]
		default:
			t.Fatalf("curl option %s is not played", args[i])
		}
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// The README's curl session, each command as it shows it.
const (
	curlFirst = `curl -i http://127.0.0.1:8080/v1/payments -H 'Content-Type: application/json' \
  -H 'X-Tenant-Id: acme' -H 'Idempotency-Key: "order-1"' \
  -d '{"customerId":"cus_1","amountCents":1250,"currency":"EUR"}'`
	curlChanged = `curl -i http://127.0.0.1:8080/v1/payments -H 'Content-Type: application/json' \
  -H 'X-Tenant-Id: acme' -H 'Idempotency-Key: "order-1"' \
  -d '{"customerId":"cus_1","amountCents":9900,"currency":"EUR"}'`
	curlNoKey = `curl -i http://127.0.0.1:8080/v1/payments -H 'Content-Type: application/json' \
  -H 'X-Tenant-Id: acme' \
  -d '{"customerId":"cus_1","amountCents":1250,"currency":"EUR"}'`
	curlGet = `curl -i http://127.0.0.1:8080/v1/payments/PAYMENT_ID -H 'X-Tenant-Id: acme'`
)

// The problem details the README shows.
const (
	problemReused  = `{"type":"https://pkg.go.dev/github.com/idemkit/idem#ReasonKeyReused","title":"Idempotency-Key is already used","status":422,"detail":"This Idempotency-Key was used with a different request to this operation; send a new key with a new request.","reason":"IDEMPOTENCY_KEY_REUSED"}`
	problemMissing = `{"type":"https://pkg.go.dev/github.com/idemkit/idem#ReasonKeyMissing","title":"Idempotency-Key is missing","status":400,"detail":"This operation requires an Idempotency-Key header: a new key with each new request, and the same key with every retry of it.","reason":"IDEMPOTENCY_KEY_MISSING"}`
)

// TestCurlSession plays the README's curl session against the server with
// -http-listen: the first call, its replay, the key reused with another
// amount and a call without a key; then reads the payment back. One
// payment is recorded.
func TestCurlSession(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{curlFirst, curlChanged, curlNoKey, curlGet, problemReused, problemMissing} {
		if !strings.Contains(string(readme), s) {
			t.Fatalf("the README does not show\n%s", s)
		}
	}
	srv := startGatewayServer(t)

	resp, first := curl(t, srv.httpURL, curlFirst)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" ||
		resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first call: %s %v %s", resp.Status, resp.Header, first)
	}
	var created paymentsv1.CreatePaymentResponse
	if err := protojson.Unmarshal(first, &created); err != nil {
		t.Fatalf("first call: %s: %v", first, err)
	}
	p := created.GetPayment()
	if p.GetId() == "" || p.GetCustomerId() != "cus_1" || p.GetAmountCents() != 1250 || p.GetCurrency() != "EUR" || p.GetCreateTime() == nil {
		t.Fatalf("first call: %s", first)
	}

	resp, again := curl(t, srv.httpURL, curlFirst)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "true" || string(again) != string(first) {
		t.Fatalf("replay: %s %v %s; want the first answer with Idempotent-Replayed: true", resp.Status, resp.Header, again)
	}

	for _, c := range []struct {
		name, cmd string
		status    int
		body      string
	}{
		{"changed body", curlChanged, http.StatusUnprocessableEntity, problemReused},
		{"no key", curlNoKey, http.StatusBadRequest, problemMissing},
	} {
		resp, body := curl(t, srv.httpURL, c.cmd)
		if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/problem+json" ||
			strings.TrimSpace(string(body)) != c.body {
			t.Fatalf("%s: %s %s\n%s\nwant %d application/problem+json\n%s", c.name, resp.Status,
				resp.Header.Get("Content-Type"), body, c.status, c.body)
		}
	}

	resp, got := curl(t, srv.httpURL, strings.Replace(curlGet, "PAYMENT_ID", p.GetId(), 1))
	var read paymentsv1.GetPaymentResponse
	if err := protojson.Unmarshal(got, &read); err != nil || resp.StatusCode != http.StatusOK || !proto.Equal(read.GetPayment(), p) {
		t.Fatalf("GET: %s %s (%v); want %v", resp.Status, got, err, p)
	}

	var payments, total, keys int
	if err := srv.pool.QueryRow(t.Context(), `SELECT
		(SELECT count(*) FROM payments WHERE tenant_id = 'acme' AND request_key = 'order-1'),
		(SELECT count(*) FROM payments),
		(SELECT count(*) FROM idempotency_keys WHERE tenant = 'acme' AND key = 'order-1' AND status = 'recorded')`,
	).Scan(&payments, &total, &keys); err != nil {
		t.Fatal(err)
	}
	if payments != 1 || total != 1 || keys != 1 {
		t.Fatalf("%d payments of order-1 (%d in all), %d completed keys; want 1, 1, 1", payments, total, keys)
	}
}

// TestMixedTransports: a CreatePayment over gRPC and its retry over HTTP,
// or the other way round, are one operation: the retry replays the
// recorded payment, as JSON over HTTP.
func TestMixedTransports(t *testing.T) {
	srv := startGatewayServer(t)
	conn, err := grpc.NewClient(srv.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := paymentsv1.NewPaymentServiceClient(conn)
	req := &paymentsv1.CreatePaymentRequest{CustomerId: "cus_2", AmountCents: 700, Currency: "EUR", Note: "n"}
	reqJSON := `{"customerId":"cus_2","amountCents":700,"currency":"EUR","note":"n"}`
	post := func(key string) (*http.Response, []byte) {
		return curl(t, srv.httpURL, fmt.Sprintf(`curl -i http://127.0.0.1:8080/v1/payments -H 'Content-Type: application/json' -H 'X-Tenant-Id: acme' -H 'Idempotency-Key: %s' -d '%s'`, key, reqJSON))
	}
	keyed := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(t.Context(), idem.KeyHeader, key, "x-tenant-id", "acme")
	}

	t.Run("gRPC, then HTTP", func(t *testing.T) {
		first, err := client.CreatePayment(keyed("mixed-1"), req)
		if err != nil {
			t.Fatal(err)
		}
		resp, body := post(`"mixed-1"`)
		var again paymentsv1.CreatePaymentResponse
		if err := protojson.Unmarshal(body, &again); err != nil || resp.StatusCode != http.StatusOK ||
			resp.Header.Get("Idempotent-Replayed") != "true" || !proto.Equal(&again, first) {
			t.Fatalf("HTTP retry: %s %q %s (%v); want 200, replayed, %v", resp.Status,
				resp.Header.Get("Idempotent-Replayed"), body, err, first)
		}
	})
	t.Run("HTTP, then gRPC", func(t *testing.T) {
		resp, body := post("mixed-2")
		var first paymentsv1.CreatePaymentResponse
		if err := protojson.Unmarshal(body, &first); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP call: %s %s (%v)", resp.Status, body, err)
		}
		var header metadata.MD
		again, err := client.CreatePayment(keyed("mixed-2"), req, grpc.Header(&header))
		if err != nil {
			t.Fatal(err)
		}
		if v := header.Get(idem.ReplayedHeader); len(v) != 1 || v[0] != "true" || !proto.Equal(again, &first) {
			t.Fatalf("gRPC retry: %v, %s %v; want %v, replayed", again, idem.ReplayedHeader, v, &first)
		}
	})

	var n int
	if err := srv.pool.QueryRow(t.Context(), `SELECT count(*) FROM payments WHERE customer_id = 'cus_2'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d payments, want 2 (one per key)", n)
	}
}

func TestDialTarget(t *testing.T) {
	for _, c := range []struct{ addr, want string }{
		{"127.0.0.1:50051", "127.0.0.1:50051"},
		{"0.0.0.0:50051", "localhost:50051"},
		{"[::]:50051", "localhost:50051"},
		{"[::1]:50051", "[::1]:50051"},
	} {
		a, err := net.ResolveTCPAddr("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := dialTarget(a); got != c.want {
			t.Errorf("dialTarget(%s) = %s, want %s", c.addr, got, c.want)
		}
	}
}

// serve runs the server as run does on the listeners given (nil: none) and
// the shard databases dsns, until t ends; then it stops it and checks that
// it stopped cleanly.
func serve(t *testing.T, lis, httpLis, metricsLis net.Listener, dsns ...string) {
	t.Helper()
	serveAdmin(t, lis, httpLis, metricsLis, nil, dsns...)
}

// serveAdmin is serve, serving the admin service too unless adm is nil.
func serveAdmin(t *testing.T, lis, httpLis, metricsLis net.Listener, adm *adminConfig, dsns ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, lis, httpLis, metricsLis, adm, "", dsns...) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("server did not stop after its context ended")
		}
	})
}
