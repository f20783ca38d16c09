package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/transport"
)

// eachStore runs f on a server of each store, PostgreSQL and store/memory,
// once per protocol.
func eachStore(t *testing.T, s setup, f func(t *testing.T, e *env, p protocol)) {
	t.Helper()
	idemtest.EachStore(t, func(t *testing.T, mem bool) {
		eachProtocol(t, func(t *testing.T, p protocol) {
			s := s
			s.memory = mem
			f(t, newEnv(t, s), p)
		})
	})
}

func TestDuplicateInFlightIsAborted(t *testing.T) {
	s := setup{
		storeOpts: []postgres.Option{postgres.WithLockTimeout(300 * time.Millisecond)},
		memOpts:   []memory.Option{memory.WithLockTimeout(50 * time.Millisecond)},
		opts:      []idem.Option{idem.WithRetryDelay(1500 * time.Millisecond)},
	}
	eachStore(t, s, func(t *testing.T, e *env, p protocol) {
		entered, release := make(chan struct{}), make(chan struct{})
		e.svc.setHook(func(ctx context.Context, run int) error {
			if run == 1 {
				close(entered)
				<-release
			}
			return nil
		})
		client := e.payments(p)
		var wg sync.WaitGroup
		var firstErr error
		wg.Go(func() {
			_, firstErr = client.CallUnary(context.Background(), keyed(payment(1250), p.header("k1")))
		})
		<-entered
		_, err := client.CallUnary(t.Context(), keyed(payment(1250), p.header("k1")))
		close(release)
		wg.Wait()
		if firstErr != nil {
			t.Fatal(firstErr)
		}
		ce := wantCode(t, err, connect.CodeAborted)
		if info := detail[*errdetails.ErrorInfo](ce); info.GetReason() != idem.ReasonKeyInUse {
			t.Errorf("ErrorInfo %v, want %s", info, idem.ReasonKeyInUse)
		}
		if ri := detail[*errdetails.RetryInfo](ce); ri.GetRetryDelay().AsDuration() != 1500*time.Millisecond {
			t.Errorf("RetryInfo %v, want 1.5s", ri)
		}
		// Over Connect, plain HTTP clients get the draft's Retry-After.
		want := ""
		if p.name == "connect" || p.name == "connect+json" {
			want = "2"
		}
		if got := ce.Meta().Get("Retry-After"); got != want {
			t.Errorf("Retry-After %q, want %q", got, want)
		}
		if runs, _ := e.svc.executions(); runs != 1 {
			t.Errorf("%d executions, want 1", runs)
		}
		if n := e.paid(t); n != 1 {
			t.Errorf("%d payments, want 1", n)
		}
	})
}

func TestMalformedKeyIsRefused(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env, p protocol) {
		cases := []struct{ value, says string }{
			{`"k1`, "Structured Field String"},
			{`"k1" x`, "Structured Field String"},
			{`k"1`, "must start and end with a double quote"},
			{`"k 1"`, "visible ASCII"},
			// Two header lines as a proxy merges them into one, a list,
			// parameters.
			{`k1,k2`, "more than one key"},
			{`k1, k2`, "more than one key"},
			{`"k1", "k2"`, "more than one key"},
			{`"k1";p=1`, "parameters"},
			{`k:1`, "token"},
		}
		if p.grpc {
			// gRPC metadata carries the key as it is.
			cases = []struct{ value, says string }{
				{"k 1", "visible ASCII"},
				{strings.Repeat("k", 256), "at most 255 bytes"},
			}
		}
		for _, c := range cases {
			_, err := e.payments(p).CallUnary(t.Context(), keyed(payment(1250), c.value))
			ce := wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.Contains(ce.Message(), c.says) {
				t.Errorf("%q: message %q does not say %q", c.value, ce.Message(), c.says)
			}
			if v := violation(ce); v.GetField() != idem.KeyHeader || !strings.Contains(v.GetDescription(), c.says) {
				t.Errorf("%q: violation %v, want one on %s saying %q", c.value, v, idem.KeyHeader, c.says)
			}
			if info := detail[*errdetails.ErrorInfo](ce); info.GetReason() != idem.ReasonKeyInvalid {
				t.Errorf("%q: ErrorInfo %v, want reason %s", c.value, info, idem.ReasonKeyInvalid)
			}
		}
		// Two values of the one header field, alike or not.
		req := keyed(payment(1250), p.header("k1"))
		req.Header().Add(idem.KeyHeader, p.header("k1"))
		_, err := e.payments(p).CallUnary(t.Context(), req)
		if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.Contains(ce.Message(), "exactly one value") {
			t.Errorf("two values: message %q", ce.Message())
		}
		if runs, _ := e.svc.executions(); runs != 0 {
			t.Errorf("%d executions, want none", runs)
		}
		if n := e.paid(t) + e.keys(t); n != 0 {
			t.Errorf("%d payments and keys, want none", n)
		}
	})
}

// A method without side effects ignores a well-formed key, as on grpc-go:
// the call runs untouched. A malformed key is refused with
// INVALID_ARGUMENT, as on any method, and the handler does not run.
func TestMethodWithoutSideEffectsIgnoresKeys(t *testing.T) {
	e := newEnv(t, setup{})
	eachProtocol(t, func(t *testing.T, p protocol) {
		client := newClient[testv1.GetPaymentRequest, testv1.GetPaymentResponse](e, p, getPayment)
		before, _ := e.svc.executions()
		malformed := [][]string{{`"k1`}, {"k1,k2"}, {`"k1", "k2"`}, {`"k1";p=1`}, {"k 1"}, {p.header("k1"), p.header("k2")}}
		if p.grpc {
			// gRPC metadata carries the key as it is.
			malformed = [][]string{{"k 1"}, {strings.Repeat("k", 256)}, {"k1", "k2"}}
		}
		for _, values := range malformed {
			req := keyed(&testv1.GetPaymentRequest{Id: "pay_1"}, "")
			for _, v := range values {
				req.Header().Add(idem.HTTPKeyHeader, v)
			}
			_, err := client.CallUnary(t.Context(), req)
			ce := wantCode(t, err, connect.CodeInvalidArgument)
			if v := violation(ce); v.GetField() != idem.KeyHeader {
				t.Errorf("key %q: violation %v, want one on %s", values, v, idem.KeyHeader)
			}
		}
		if runs, _ := e.svc.executions(); runs != before {
			t.Errorf("the handler ran %d times for malformed keys, want 0", runs-before)
		}
		for range 2 {
			resp, err := client.CallUnary(t.Context(), keyed(&testv1.GetPaymentRequest{Id: "pay_1"}, p.header("k1")))
			if err != nil || resp.Msg.GetPayment().GetId() != "pay_1" {
				t.Errorf("a well-formed key: %v, %v", resp, err)
			}
		}
		if runs, keys := e.svc.executions(); runs != before+2 || keys[len(keys)-1] != "" {
			t.Errorf("%d executions with a well-formed key, the last keyed %q; want 2, unkeyed", runs-before, keys[len(keys)-1])
		}
	})
	if n := e.keys(t); n != 0 {
		t.Errorf("%d keys, want none", n)
	}
}

func TestKeyedStreamIsRefused(t *testing.T) {
	e := newEnv(t, setup{memory: true})
	eachProtocol(t, func(t *testing.T, p protocol) {
		if p.name == "connect+json" {
			return // the same protocol as connect
		}
		client := newClient[testv1.ReadRequest, testv1.ReadResponse](e, p, watch)
		before, _ := e.svc.executions()

		stream, err := client.CallServerStream(t.Context(), keyed(&testv1.ReadRequest{Value: "v"}, p.header("k1")))
		if err != nil {
			t.Fatal(err)
		}
		for stream.Receive() {
			t.Errorf("a keyed stream received %v", stream.Msg())
		}
		ce := wantCode(t, stream.Err(), connect.CodeInvalidArgument)
		_ = stream.Close()
		if !strings.Contains(ce.Message(), "unary methods") || violation(ce).GetField() != idem.KeyHeader {
			t.Errorf("error %v, want one saying keys apply to unary methods, on %s", ce, idem.KeyHeader)
		}
		if runs, _ := e.svc.executions(); runs != before {
			t.Errorf("the keyed stream's handler ran")
		}

		stream, err = client.CallServerStream(t.Context(), keyed(&testv1.ReadRequest{Value: "v"}, ""))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for stream.Receive() {
			n++
		}
		if err := stream.Err(); err != nil || n != 1 {
			t.Errorf("a stream without a key: %d messages, %v", n, err)
		}
		_ = stream.Close()
	})
}

// A handler's error that wraps an error of idem's (one its own outbound
// call got, say) is the handler's: sent with the handler's code and
// metadata, as it is recorded and replayed.
func TestHandlerErrorWrappingIdemsIsTheHandlers(t *testing.T) {
	e := newEnv(t, setup{memory: true})
	e.svc.setHook(func(context.Context, int) error {
		ce := connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("the ledger refused the call: %w", transport.StreamKeyRefused("/ledger.v1.Ledger/Watch")))
		ce.Meta().Set("X-Decline", "ledger")
		return ce
	})
	eachProtocol(t, func(t *testing.T, p protocol) {
		client := e.payments(p)
		key := p.header("wrapped-" + p.name)
		_, err := client.CallUnary(t.Context(), keyed(payment(1250), key))
		first := wantCode(t, err, connect.CodeFailedPrecondition)
		if got := first.Meta().Get("X-Decline"); got != "ledger" {
			t.Errorf("the handler's error metadata X-Decline = %q on the first answer", got)
		}
		_, err = client.CallUnary(t.Context(), keyed(payment(1250), key))
		again := wantCode(t, err, connect.CodeFailedPrecondition)
		if first.Message() != again.Message() || again.Meta().Get(idem.HTTPReplayedHeader) != "true" {
			t.Errorf("replay %v (replayed %q), want %v replayed", again, again.Meta().Get(idem.HTTPReplayedHeader), first)
		}
	})
}

// Over Connect, a handler's error with a RetryInfo carries Retry-After, on
// its first answer as on its replays.
func TestHandlerRetryInfoIsRetryAfter(t *testing.T) {
	e := newEnv(t, setup{memory: true})
	e.svc.setHook(func(context.Context, int) error {
		ce := connect.NewError(connect.CodeFailedPrecondition, errors.New("the account is being audited"))
		d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)})
		if err != nil {
			return err
		}
		ce.AddDetail(d)
		return ce
	})
	eachProtocol(t, func(t *testing.T, p protocol) {
		want := ""
		if p.name == "connect" || p.name == "connect+json" {
			want = "2"
		}
		client := e.payments(p)
		key := p.header("audited-" + p.name)
		for _, attempt := range []string{"first answer", "replay"} {
			_, err := client.CallUnary(t.Context(), keyed(payment(1250), key))
			ce := wantCode(t, err, connect.CodeFailedPrecondition)
			if got := ce.Meta().Get("Retry-After"); got != want {
				t.Errorf("%s: Retry-After %q, want %q", attempt, got, want)
			}
		}
	})
}

// A handler that returns its context's error is classified by that error's
// code, CANCELLED or DEADLINE_EXCEEDED, not as UNKNOWN: a classifier that
// records every other code lets its retry run again.
func TestHandlerContextErrorIsClassifiedByItsCode(t *testing.T) {
	transient := func(st *spb.Status) bool {
		switch code.Code(st.GetCode()) {
		case code.Code_CANCELLED, code.Code_DEADLINE_EXCEEDED, code.Code_UNAVAILABLE:
			return false
		}
		return true
	}
	e := newEnv(t, setup{memory: true, opts: []idem.Option{idem.WithClassifier(transient)}})
	var want int
	eachProtocol(t, func(t *testing.T, p protocol) {
		e.svc.setHook(func(_ context.Context, run int) error {
			if run%2 == 1 {
				return context.Canceled
			}
			return nil
		})
		client := e.payments(p)
		key := p.header("canceled-" + p.name)
		_, err := client.CallUnary(t.Context(), keyed(payment(1250), key))
		wantCode(t, err, connect.CodeCanceled)
		resp, err := client.CallUnary(t.Context(), keyed(payment(1250), key))
		if err != nil {
			t.Fatalf("the retry: %v, want it run again", err)
		}
		want += 2
		if runs, _ := e.svc.executions(); runs != want || resp.Header().Get(idem.HTTPReplayedHeader) != "" {
			t.Errorf("%d executions (replayed %q), want %d", runs, resp.Header().Get(idem.HTTPReplayedHeader), want)
		}
	})
}
