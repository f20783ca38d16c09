package idemconnect_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// retrying retries a call up to attempts times while it fails with
// UNAVAILABLE, as a retry interceptor placed after idem's would.
func retrying(attempts int) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			for n := 1; ; n++ {
				resp, err := next(ctx, req)
				if connect.CodeOf(err) != connect.CodeUnavailable || n == attempts {
					return resp, err
				}
			}
		}
	}
}

func TestClientKeyIsOnePerLogicalCall(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env, p protocol) {
		e.svc.setHook(func(_ context.Context, run int) error {
			if run <= 2 {
				return connect.NewError(connect.CodeUnavailable, errors.New("try again"))
			}
			return nil
		})
		client := e.payments(p, idemconnect.NewClientInterceptor(), retrying(5))
		req := connect.NewRequest(payment(1250))
		if _, err := client.CallUnary(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		runs, keys := e.svc.executions()
		if runs != 3 || keys[0] != keys[1] || keys[1] != keys[2] {
			t.Fatalf("%d executions with keys %q, want 3 with one key", runs, keys)
		}
		if u, err := uuid.Parse(keys[0]); err != nil || u.Version() != 7 {
			t.Errorf("key %q is not a UUIDv7", keys[0])
		}
		// On the wire: the IETF header, or gRPC metadata as it is.
		if got := e.svc.headers()[0]; got != p.header(keys[0]) {
			t.Errorf("key header %q, want %q", got, p.header(keys[0]))
		}
		if n := e.paid(t); n != 1 {
			t.Errorf("%d payments, want 1", n)
		}
		// The request is left as it was: sent again, it is another
		// logical call, with a key of its own.
		if got := req.Header().Values(idem.HTTPKeyHeader); len(got) != 0 {
			t.Errorf("the request keeps the key header %q", got)
		}
		if _, err := client.CallUnary(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		if runs, keys = e.svc.executions(); runs != 4 || keys[3] == keys[0] {
			t.Errorf("a second logical call: %d executions in all, keys %q; want a new key", runs, keys)
		}
		if n := e.paid(t); n != 2 {
			t.Errorf("%d payments, want 2", n)
		}
	})
}

func TestClientSendsTheChosenKey(t *testing.T) {
	e := newEnv(t, setup{memory: true})
	eachProtocol(t, func(t *testing.T, p protocol) {
		client := e.payments(p, idemconnect.NewClientInterceptor())
		// A key that needs quoting as a Structured Field String.
		key := `order-"7"\` + p.name
		if _, err := client.CallUnary(idem.ContextWithKey(t.Context(), key), connect.NewRequest(payment(1250))); err != nil {
			t.Fatal(err)
		}
		// The caller's own header, in its own syntax, goes as it is.
		own := "own-" + p.name
		if _, err := client.CallUnary(t.Context(), keyed(payment(1250), p.header(own))); err != nil {
			t.Fatal(err)
		}
		_, keys := e.svc.executions()
		if got := keys[len(keys)-2:]; got[0] != key || got[1] != own {
			t.Errorf("the server saw keys %q, want %q and %q", got, key, own)
		}
		_, err := client.CallUnary(idem.ContextWithKey(t.Context(), "a b"), connect.NewRequest(payment(1250)))
		wantCode(t, err, connect.CodeInvalidArgument)
	})
}

// A keyed handler's calls get keys derived from its request's, the same on
// every execution, so that a retried handler's calls are replayed.
func TestClientDerivesChildKeys(t *testing.T) {
	downstream := newEnv(t, setup{})
	eachProtocol(t, func(t *testing.T, p protocol) {
		before, _ := downstream.svc.executions()
		payments := downstream.payments(p, idemconnect.NewClientInterceptor())
		var (
			runs     int
			replayed []string
		)
		front := func(ctx context.Context, req *connect.Request[testv1.DoRequest]) (*connect.Response[testv1.DoResponse], error) {
			runs++
			first, err := payments.CallUnary(ctx, connect.NewRequest(payment(1250)))
			if err != nil {
				return nil, err
			}
			// A handler that forwards its request's headers: the request's
			// key is never forwarded.
			out := connect.NewRequest(payment(500))
			out.Header().Set(idem.HTTPKeyHeader, req.Header().Get(idem.HTTPKeyHeader))
			refund, err := payments.CallUnary(idem.ContextWithStep(ctx, "refund"), out)
			if err != nil {
				return nil, err
			}
			replayed = append(replayed, first.Header().Get(idem.HTTPReplayedHeader), refund.Header().Get(idem.HTTPReplayedHeader))
			if runs == 1 {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("lost the reply"))
			}
			return connect.NewResponse(&testv1.DoResponse{Value: req.Msg.GetValue()}), nil
		}
		mux := serveMuxFor(do, connect.NewUnaryHandler(do, front, connect.WithInterceptors(
			idemconnect.NewInterceptor(newEngine(t, memory.New(), idem.WithTenant(tenantFromHeader))))))
		frontURL := serveMux(t, mux)
		client := connect.NewClient[testv1.DoRequest, testv1.DoResponse](downstream.client, frontURL+do,
			append([]connect.ClientOption{connect.WithInterceptors(idemconnect.NewClientInterceptor(), retrying(3))}, p.opts...)...)
		req := connect.NewRequest(&testv1.DoRequest{Value: "v"})
		req.Header().Set("X-Tenant-Id", "acme")
		ctx := idem.ContextWithKey(t.Context(), "parent-"+p.name)
		if _, err := client.CallUnary(ctx, req); err != nil {
			t.Fatal(err)
		}

		parent := store.Key{Tenant: "acme", Method: do, Key: "parent-" + p.name}
		want := []string{callKey(parent, createPayment, 1), idem.DeriveKey(parent, "refund")}
		n, keys := downstream.svc.executions()
		if got := keys[before:]; n-before != 2 || !slices.Equal(got, want) {
			t.Errorf("downstream executions with keys %q, want %q", got, want)
		}
		if !slices.Equal(replayed, []string{"", "", "true", "true"}) {
			t.Errorf("downstream answers replayed: %q, want the retried handler's calls replayed", replayed)
		}
	})
	if n := downstream.paid(t); n != 2*len(protocols) {
		t.Errorf("%d payments, want 2 per protocol", n)
	}
}

// A request that carries its key in request_id, the field marked
// (idem.v1.field).key (AIP-155), is sent with that key and no other: every
// attempt of a retrying interceptor below idem's runs under it, and the
// payment is made once.
func TestClientSendsTheRequestFieldKey(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env, p protocol) {
		e.svc.setHook(func(_ context.Context, run int) error {
			if run == 1 {
				return connect.NewError(connect.CodeUnavailable, errors.New("try again"))
			}
			return nil
		})
		client := e.payments(p, idemconnect.NewClientInterceptor(), retrying(3))
		msg := payment(1250)
		msg.RequestId = "req-" + p.name
		for _, ctx := range []context.Context{t.Context(), idem.ContextWithKey(t.Context(), "elsewhere")} {
			if _, err := client.CallUnary(ctx, connect.NewRequest(msg)); err != nil {
				t.Fatal(err)
			}
		}
		runs, keys := e.svc.executions()
		if want := []string{msg.RequestId, msg.RequestId}; runs != 2 || !slices.Equal(keys, want) {
			t.Fatalf("%d executions under keys %q, want 2 under %q (the second call a replay)", runs, keys, want)
		}
		for i, h := range e.svc.headers() {
			if h != "" && h != p.header(msg.RequestId) {
				t.Errorf("attempt %d carried the key header %q besides request_id %q", i+1, h, msg.RequestId)
			}
		}
		if n := e.paid(t); n != 1 {
			t.Errorf("%d payments, want 1", n)
		}
	})
}

// callKey is the key of the n-th call to method that the request parent
// makes without naming a step, as the client interceptor derives it: the
// hex-encoded SHA-256 of the parent's tenant, method and key, "call",
// method and n, each preceded by its length as a big-endian uint64.
func callKey(parent store.Key, method string, n int) string {
	h := sha256.New()
	for _, s := range []string{parent.Tenant, parent.Method, parent.Key, "call", method, strconv.Itoa(n)} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}
