package idemconnect_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/postgres"
)

// A call over grpc-go and its retry over connect-go, served on one store,
// are one operation, whichever comes first.
func TestMixedTransportsReplay(t *testing.T) {
	e := newEnv(t, setup{})
	grpcClient := e.serveGRPC(t)
	eachProtocol(t, func(t *testing.T, p protocol) {
		before := e.paid(t)

		// grpc-go first, then connect-go.
		key := "grpc-first-" + p.name
		first, err := grpcClient.CreatePayment(
			metadata.AppendToOutgoingContext(t.Context(), idem.KeyHeader, key), payment(1250))
		if err != nil {
			t.Fatal(err)
		}
		retry, err := e.payments(p).CallUnary(t.Context(), keyed(payment(1250), p.header(key)))
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(first, retry.Msg) || retry.Header().Get(idem.HTTPReplayedHeader) != "true" {
			t.Errorf("connect-go retry: %v (replayed %q), want the replay of %v",
				retry.Msg, retry.Header().Get(idem.HTTPReplayedHeader), first)
		}

		// connect-go first, then grpc-go.
		key = "connect-first-" + p.name
		resp, err := e.payments(p).CallUnary(t.Context(), keyed(payment(1250), p.header(key)))
		if err != nil {
			t.Fatal(err)
		}
		var header metadata.MD
		again, err := grpcClient.CreatePayment(
			metadata.AppendToOutgoingContext(t.Context(), idem.KeyHeader, key), payment(1250), grpc.Header(&header))
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(resp.Msg, again) || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Errorf("grpc-go retry: %v (header %v), want the replay of %v", again, header, resp.Msg)
		}

		if n := e.paid(t) - before; n != 2 {
			t.Errorf("%d payments, want one per key", n)
		}
	})
}

// A grpc-go client of a connect-go server reads the replay marker as
// metadata idempotent-replayed.
func TestGRPCGoClientOfConnectServer(t *testing.T) {
	e := newEnv(t, setup{})
	conn, err := grpc.NewClient(strings.TrimPrefix(e.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := testv1.NewPaymentServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(t.Context(), idem.KeyHeader, "k1")
	var headers [2]metadata.MD
	var resps [2]*testv1.CreatePaymentResponse
	for n := range 2 {
		if resps[n], err = client.CreatePayment(ctx, payment(1250), grpc.Header(&headers[n])); err != nil {
			t.Fatal(err)
		}
	}
	if !proto.Equal(resps[0], resps[1]) {
		t.Errorf("replay %v, want %v", resps[1], resps[0])
	}
	if got := headers[0].Get(idem.ReplayedHeader); len(got) != 0 {
		t.Errorf("first answer: %s %q", idem.ReplayedHeader, got)
	}
	if got := headers[1].Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Errorf("replay: %s %q, want true", idem.ReplayedHeader, got)
	}
	if runs, _ := e.svc.executions(); runs != 1 {
		t.Errorf("%d executions, want 1", runs)
	}
	if n := e.paid(t); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
}

// connectError is the JSON body of an error of the Connect protocol.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type string `json:"type"`
	} `json:"details"`
}

// A client without connect-go: a plain HTTP POST of JSON with the IETF
// header.
func TestPlainHTTPJSON(t *testing.T) {
	e := newEnv(t, setup{storeOpts: []postgres.Option{postgres.WithLockTimeout(300 * time.Millisecond)}})
	grpcClient := e.serveGRPC(t)
	url := e.url + createPayment
	send := func(ctx context.Context, body, key string) (*http.Response, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return nil, nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	post := func(t *testing.T, body, key string) (*http.Response, []byte) {
		t.Helper()
		resp, b, err := send(t.Context(), body, key)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	wantError := func(t *testing.T, resp *http.Response, body []byte, status int, code, says, detail string) {
		t.Helper()
		var ce connectError
		if err := json.Unmarshal(body, &ce); err != nil || resp.StatusCode != status || ce.Code != code {
			t.Fatalf("HTTP %d %s, want %d with code %s", resp.StatusCode, body, status, code)
		}
		if !strings.Contains(ce.Message, says) || len(ce.Details) == 0 || ce.Details[0].Type != detail {
			t.Errorf("error %s, want one saying %q with detail %s", body, says, detail)
		}
	}
	order := `{"customerId": "cus_1", "amountCents": "1250", "currency": "EUR"}`

	first, firstBody := post(t, order, `"k1"`)
	if first.StatusCode != http.StatusOK || first.Header.Get(idem.HTTPReplayedHeader) != "" {
		t.Fatalf("first call: HTTP %d %s, replayed %q", first.StatusCode, firstBody, first.Header.Get(idem.HTTPReplayedHeader))
	}
	var created testv1.CreatePaymentResponse
	if err := protojson.Unmarshal(firstBody, &created); err != nil || created.GetPayment().GetId() == "" {
		t.Fatalf("first call: %s (%v)", firstBody, err)
	}
	// The quoted key and the bare one are the same key.
	for _, key := range []string{`"k1"`, `k1`} {
		resp, body := post(t, order, key)
		if resp.StatusCode != http.StatusOK || !bytes.Equal(body, firstBody) || resp.Header.Get(idem.HTTPReplayedHeader) != "true" {
			t.Errorf("retry with %s: HTTP %d %s, replayed %q; want the first body replayed",
				key, resp.StatusCode, body, resp.Header.Get(idem.HTTPReplayedHeader))
		}
	}

	resp, body := post(t, `{"customerId": "cus_1", "amountCents": "9999", "currency": "EUR"}`, `"k1"`)
	wantError(t, resp, body, http.StatusBadRequest, "failed_precondition", "different request", "google.rpc.ErrorInfo")
	resp, body = post(t, order, "")
	wantError(t, resp, body, http.StatusBadRequest, "invalid_argument", "required", "google.rpc.BadRequest")
	resp, body = post(t, order, `"k2`)
	wantError(t, resp, body, http.StatusBadRequest, "invalid_argument", "Structured Field String", "google.rpc.BadRequest")

	// In flight: 409 with Retry-After.
	entered, release := make(chan struct{}), make(chan struct{})
	e.svc.setHook(func(_ context.Context, run int) error {
		if run == 2 {
			close(entered)
			<-release
		}
		return nil
	})
	var wg sync.WaitGroup
	var firstErr error
	wg.Go(func() { _, _, firstErr = send(context.Background(), order, `"k3"`) })
	<-entered
	resp, body = post(t, order, `"k3"`)
	close(release)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	wantError(t, resp, body, http.StatusConflict, "aborted", "in flight", "google.rpc.RetryInfo")
	if got := resp.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}

	// A gRPC call retried over HTTP: the JSON body is rendered from the
	// recorded message.
	grpcFirst, err := grpcClient.CreatePayment(metadata.AppendToOutgoingContext(t.Context(), idem.KeyHeader, "k4"), payment(1250))
	if err != nil {
		t.Fatal(err)
	}
	resp, body = post(t, order, `"k4"`)
	var replayed testv1.CreatePaymentResponse
	if err := protojson.Unmarshal(body, &replayed); err != nil || !proto.Equal(&replayed, grpcFirst) ||
		resp.Header.Get(idem.HTTPReplayedHeader) != "true" {
		t.Errorf("HTTP retry of a gRPC call: HTTP %d %s, want the replay of %v", resp.StatusCode, body, grpcFirst)
	}

	if runs, _ := e.svc.executions(); runs != 3 {
		t.Errorf("%d executions, want 3 (k1, k3, k4)", runs)
	}
	if n := e.paid(t); n != 3 {
		t.Errorf("%d payments, want 3", n)
	}
}
