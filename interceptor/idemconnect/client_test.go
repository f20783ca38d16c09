package idemconnect_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// retrying is idem's retry interceptor, sending a call up to attempts
// times, without waiting between them.
func retrying(attempts int) connect.Interceptor {
	return idemconnect.NewRetryInterceptor(idemconnect.WithMaxAttempts(attempts), idemconnect.WithSleep((&waits{}).sleep))
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
		msg := payment(1250)
		req := connect.NewRequest(msg)
		if _, err := client.CallUnary(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		runs, keys := e.svc.executions()
		if runs != 3 || keys[0] != keys[1] || keys[1] != keys[2] {
			t.Fatalf("%d executions with keys %q, want 3 with one key", runs, keys)
		}
		// The empty request_id carried the key too, on every attempt (as
		// AIP-4235 has client libraries fill it), and the caller's message
		// is the one it made, still without one.
		if ids := e.svc.requestIDs(); !slices.Equal(ids, keys) {
			t.Errorf("the attempts carried request_id %q, want their keys %q", ids, keys)
		}
		if req.Msg != msg || msg.GetRequestId() != "" {
			t.Errorf("the caller's request now holds %p with request_id %q, want its own %p, empty", req.Msg, req.Msg.GetRequestId(), msg)
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
		if ids := e.svc.requestIDs(); ids[3] != keys[3] {
			t.Errorf("a second logical call: request_id %q, want its key %q", ids[3], keys[3])
		}
		if n := e.paid(t); n != 2 {
			t.Errorf("%d payments, want 2", n)
		}
		if e.pool != nil {
			if n := e.count(t, `SELECT count(*) FROM idempotency_keys WHERE key = ANY($1) AND status = 'recorded'`, []string{keys[0], keys[3]}); n != 2 {
				t.Errorf("%d completed key rows, want one per logical call (2)", n)
			}
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

// A keyed handler's calls get keys idemtest.Derived from its request's, whether that
// key came in the header or in the request's request_id, the same on every
// execution, so that a retried handler's calls are replayed; each call
// carries its child key in its own request_id too.
func TestClientDerivesChildKeys(t *testing.T) {
	downstream := newEnv(t, setup{})
	eachProtocol(t, func(t *testing.T, p protocol) {
		for _, via := range []string{"header", "request_id"} {
			t.Run(via, func(t *testing.T) { testClientDerivesChildKeys(t, downstream, p, via) })
		}
	})
	if n := downstream.paid(t); n != 2*2*len(protocols) {
		t.Errorf("%d payments, want 2 per protocol and parent", n)
	}
}

func testClientDerivesChildKeys(t *testing.T, downstream *env, p protocol, via string) {
	before, _ := downstream.svc.executions()
	payments := downstream.payments(p, idemconnect.NewClientInterceptor())
	var (
		runs     int
		replayed []string
		parents  []string // the header each execution of the front's request came with
	)
	front := func(ctx context.Context, req *connect.Request[testv1.DoRequest]) (*connect.Response[testv1.DoResponse], error) {
		runs++
		parents = append(parents, req.Header().Get(idem.HTTPKeyHeader))
		first, err := payments.CallUnary(ctx, connect.NewRequest(payment(1250)))
		if err != nil {
			return nil, err
		}
		// A handler that forwards its request's key, in the header and in
		// request_id: that key is never forwarded.
		parentKey, _ := idem.KeyFromContext(ctx)
		msg := payment(500)
		msg.RequestId = parentKey
		out := connect.NewRequest(msg)
		out.Header().Set(idem.HTTPKeyHeader, p.header(parentKey))
		refundKey, _ := idem.ChildKey(ctx, "refund")
		refund, err := payments.CallUnary(idem.ContextWithKey(ctx, refundKey), out)
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
		idemconnect.NewInterceptor(idemtest.NewEngine(t, memory.New(), idem.WithTenant(idemtest.TenantFromHeader))))))
	frontURL := serveMux(t, mux)
	key := "parent-" + p.name + "-" + via
	req := connect.NewRequest(&testv1.DoRequest{Value: "v"})
	req.Header().Set("X-Tenant-Id", "acme")
	ics := []connect.Interceptor{retrying(3)}
	ctx := t.Context()
	if via == "header" {
		ics = append([]connect.Interceptor{idemconnect.NewClientInterceptor()}, ics...)
		ctx = idem.ContextWithKey(ctx, key)
	} else {
		req.Msg.RequestId = key // and no client interceptor: no header
	}
	client := connect.NewClient[testv1.DoRequest, testv1.DoResponse](downstream.client, frontURL+do,
		append([]connect.ClientOption{connect.WithInterceptors(ics...)}, p.opts...)...)
	if _, err := client.CallUnary(ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, h := range parents {
		if (h == "") != (via == "request_id") {
			t.Fatalf("the front's request came with the key header %q, its key in the %s", h, via)
		}
	}

	parent := store.Scope{Tenant: "acme", Method: do, Key: key}
	want := []string{idemtest.CallKey(parent, createPayment, 1), idemtest.StepKey(parent, "refund")}
	n, keys := downstream.svc.executions()
	if got := keys[before:]; n-before != 2 || !slices.Equal(got, want) {
		t.Errorf("downstream executions with keys %q, want %q", got, want)
	}
	if got := downstream.svc.requestIDs()[before:]; !slices.Equal(got, want) {
		t.Errorf("downstream requests carried request_id %q, want their keys %q", got, want)
	}
	if !slices.Equal(replayed, []string{"", "", "true", "true"}) {
		t.Errorf("downstream answers replayed: %q, want the retried handler's calls replayed", replayed)
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
