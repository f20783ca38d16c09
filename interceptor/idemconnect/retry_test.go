package idemconnect_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
)

// waits records the delays a retry interceptor asks to wait
// (idemconnect.WithSleep) without waiting them, and calls then, when set,
// with each wait's number (from 1) before it returns.
type waits struct {
	mu     sync.Mutex
	delays []time.Duration
	then   func(n int)
}

func (w *waits) sleep(ctx context.Context, d time.Duration) error {
	w.mu.Lock()
	w.delays = append(w.delays, d)
	n := len(w.delays)
	w.mu.Unlock()
	if w.then != nil {
		w.then(n)
	}
	return ctx.Err()
}

func (w *waits) all() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.delays)
}

// noRetryInfo is the delay of connectErr for an error without a RetryInfo.
const noRetryInfo = time.Duration(-1 << 63)

// connectErr returns an error of code c, with a RetryInfo of delay unless
// delay is noRetryInfo.
func connectErr(t *testing.T, c connect.Code, msg string, delay time.Duration) *connect.Error {
	t.Helper()
	ce := connect.NewError(c, errors.New(msg))
	if delay != noRetryInfo {
		d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
		if err != nil {
			t.Fatal(err)
		}
		ce.AddDetail(d)
	}
	return ce
}

// since returns the entries of all after the first n.
func since[T any](all []T, n int) []T { return all[min(n, len(all)):] }

// A duplicate of a call still in flight is answered ABORTED with a
// RetryInfo (idem's IDEMPOTENCY_KEY_IN_USE); the retry interceptor waits
// as long as it asks, sends the duplicate again with its key, and gets the
// first call's answer: one execution, one payment.
func TestRetryWaitsOutAKeyInUse(t *testing.T) {
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
		key := "in-use-" + p.name
		var (
			wg       sync.WaitGroup
			first    *connect.Response[testv1.CreatePaymentResponse]
			firstErr error
		)
		wg.Go(func() {
			first, firstErr = e.payments(p).CallUnary(context.Background(), keyed(payment(1250), p.header(key)))
		})
		finishFirst := sync.OnceFunc(func() { close(release); wg.Wait() })
		t.Cleanup(finishFirst)
		<-entered

		// The duplicate's wait lets the first call finish.
		w := &waits{then: func(int) { finishFirst() }}
		client := e.payments(p, idemconnect.NewClientInterceptor(), idemconnect.NewRetryInterceptor(idemconnect.WithSleep(w.sleep)))
		resp, err := client.CallUnary(idem.ContextWithKey(t.Context(), key), connect.NewRequest(payment(1250)))
		if err != nil {
			t.Fatalf("the duplicate: %v, want the first call's answer", err)
		}
		finishFirst()
		if firstErr != nil {
			t.Fatal(firstErr)
		}
		if !proto.Equal(resp.Msg, first.Msg) || resp.Header().Get(idem.HTTPReplayedHeader) != "true" {
			t.Errorf("the duplicate got %v (replayed %q), want the replay of %v",
				resp.Msg, resp.Header().Get(idem.HTTPReplayedHeader), first.Msg)
		}
		if got, want := w.all(), []time.Duration{1500 * time.Millisecond}; !slices.Equal(got, want) {
			t.Errorf("waited %v, want %v (the RetryInfo of the key in use)", got, want)
		}
		h := p.header(key)
		if got, want := e.arrivals.keys(), []string{h, h, h}; !slices.Equal(got, want) {
			t.Errorf("the server saw requests with keys %q, want %q (the call, then the duplicate twice)", got, want)
		}
		if runs, _ := e.svc.executions(); runs != 1 {
			t.Errorf("%d executions, want 1", runs)
		}
		if n := e.paid(t); n != 1 {
			t.Errorf("%d payments, want 1", n)
		}
		if e.pool != nil {
			if n := e.count(t, `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND status = 'recorded'`, key); n != 1 {
				t.Errorf("%d completed key rows, want 1", n)
			}
		}
	})
}

// Every attempt of a retried call carries the one key the client
// interceptor chose, in the header and in request_id, whichever of the
// two interceptors comes first: the attempt that failed (UNAVAILABLE, with
// a RetryInfo) released the key, and the retry under it pays once.
func TestRetryKeepsTheKey(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env, p protocol) {
		e.svc.setHook(func(_ context.Context, run int) error {
			if run%2 == 1 {
				return connectErr(t, connect.CodeUnavailable, "ledger unreachable", 700*time.Millisecond)
			}
			return nil
		})
		for _, retryFirst := range []bool{false, true} {
			arrived := len(e.arrivals.keys())
			ran, _ := e.svc.executions()
			paid := e.paid(t)
			w := &waits{}
			ics := []connect.Interceptor{
				idemconnect.NewClientInterceptor(),
				idemconnect.NewRetryInterceptor(idemconnect.WithSleep(w.sleep)),
			}
			if retryFirst {
				slices.Reverse(ics)
			}
			resp, err := e.payments(p, ics...).CallUnary(t.Context(), connect.NewRequest(payment(1250)))
			if err != nil {
				t.Fatalf("retry interceptor first: %v: %v", retryFirst, err)
			}
			_, all := e.svc.executions()
			keys := since(all, ran)
			if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
				t.Fatalf("retry interceptor first: %v: executions with keys %q, want 2 with one key", retryFirst, keys)
			}
			if got, want := since(e.arrivals.keys(), arrived), []string{p.header(keys[0]), p.header(keys[0])}; !slices.Equal(got, want) {
				t.Errorf("retry interceptor first: %v: the server saw keys %q, want %q", retryFirst, got, want)
			}
			if got := since(e.svc.requestIDs(), ran); !slices.Equal(got, keys) {
				t.Errorf("retry interceptor first: %v: request_id %q, want the key %q", retryFirst, got, keys)
			}
			if got, want := w.all(), []time.Duration{700 * time.Millisecond}; !slices.Equal(got, want) {
				t.Errorf("retry interceptor first: %v: waited %v, want %v (the handler's RetryInfo)", retryFirst, got, want)
			}
			if got := resp.Header().Get(idem.HTTPReplayedHeader); got != "" {
				t.Errorf("retry interceptor first: %v: the answer is a replay", retryFirst)
			}
			if n := e.paid(t) - paid; n != 1 {
				t.Errorf("retry interceptor first: %v: %d payments, want 1", retryFirst, n)
			}
		}
		if e.pool != nil {
			if n := e.count(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded'`); n != 2 {
				t.Errorf("%d completed key rows, want one per call (2)", n)
			}
		}
	})
}

// A terminal answer is returned at once: a key reused with another
// request, a missing key, a handler's own error, and a recorded error
// replayed, even one of a code the interceptor retries.
func TestRetryReturnsTerminalAnswers(t *testing.T) {
	// ABORTED is recorded too, so that its replay is one.
	deterministic := func(st *spb.Status) bool {
		switch code.Code(st.GetCode()) {
		case code.Code_FAILED_PRECONDITION, code.Code_ABORTED:
			return true
		}
		return false
	}
	eachStore(t, setup{opts: []idem.Option{idem.WithClassifier(deterministic)}}, func(t *testing.T, e *env, p protocol) {
		e.svc.setHook(func(ctx context.Context, _ int) error {
			switch key, _ := idem.KeyFromContext(ctx); key {
			case "declined":
				return connectErr(t, connect.CodeFailedPrecondition, "card declined", noRetryInfo)
			case "recorded":
				return connectErr(t, connect.CodeAborted, "the ledger is being reconciled", 250*time.Millisecond)
			}
			return nil
		})
		w := &waits{}
		retry := idemconnect.NewRetryInterceptor(idemconnect.WithSleep(w.sleep))
		client := e.payments(p, idemconnect.NewClientInterceptor(), retry)
		call := func(key string, amount int64) ([]string, error) {
			arrived := len(e.arrivals.keys())
			_, err := client.CallUnary(idem.ContextWithKey(t.Context(), key), connect.NewRequest(payment(amount)))
			return since(e.arrivals.keys(), arrived), err
		}

		if _, err := call("reused", 1250); err != nil {
			t.Fatal(err)
		}
		seen, err := call("reused", 9999)
		ce := wantCode(t, err, connect.CodeFailedPrecondition)
		if info := detail[*errdetails.ErrorInfo](ce); info.GetReason() != idem.ReasonKeyReused || len(seen) != 1 {
			t.Errorf("key reused: %d attempts answered %v, want 1 answered %s", len(seen), ce, idem.ReasonKeyReused)
		}

		arrived := len(e.arrivals.keys())
		_, err = e.payments(p, retry).CallUnary(t.Context(), connect.NewRequest(payment(1250)))
		ce = wantCode(t, err, connect.CodeInvalidArgument)
		if info := detail[*errdetails.ErrorInfo](ce); info.GetReason() != idem.ReasonKeyMissing || len(since(e.arrivals.keys(), arrived)) != 1 {
			t.Errorf("key missing: %d attempts answered %v, want 1 answered %s", len(since(e.arrivals.keys(), arrived)), ce, idem.ReasonKeyMissing)
		}

		seen, err = call("declined", 1250)
		if ce := wantCode(t, err, connect.CodeFailedPrecondition); ce.Message() != "card declined" || len(seen) != 1 {
			t.Errorf("the handler's error: %d attempts answered %v, want 1", len(seen), ce)
		}
		if len(w.all()) != 0 {
			t.Errorf("waited %v before retrying a terminal answer", w.all())
		}

		// The first answer is the handler's ABORTED, which is retried; the
		// retry gets its replay, which is not.
		seen, err = call("recorded", 1250)
		ce = wantCode(t, err, connect.CodeAborted)
		if ce.Meta().Get(idem.HTTPReplayedHeader) != "true" || !slices.Equal(seen, []string{p.header("recorded"), p.header("recorded")}) {
			t.Errorf("a recorded ABORTED: attempts with keys %q answered %v (replayed %q), want 2, the second a replay",
				seen, ce, ce.Meta().Get(idem.HTTPReplayedHeader))
		}
		if got, want := w.all(), []time.Duration{250 * time.Millisecond}; !slices.Equal(got, want) {
			t.Errorf("waited %v, want %v (before the one retry)", got, want)
		}
		if runs, _ := e.svc.executions(); runs != 3 {
			t.Errorf("%d executions, want 3 (reused, declined, recorded)", runs)
		}
		if n := e.paid(t); n != 1 {
			t.Errorf("%d payments, want 1 (reused)", n)
		}
	})
}

// The interceptor sends a call at most WithMaxAttempts times (5 by
// default), waiting as WithBackoff says when an answer carries no
// RetryInfo.
func TestRetryAttemptsAndBackoff(t *testing.T) {
	e := newEnv(t, setup{memory: true})
	e.svc.setHook(func(context.Context, int) error {
		return connectErr(t, connect.CodeUnavailable, "ledger unreachable", noRetryInfo)
	})
	ms := time.Millisecond
	cases := []struct {
		name  string
		opts  []idemconnect.RetryOption
		waits []time.Duration
	}{
		{"default", nil, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms}},
		{"two attempts", []idemconnect.RetryOption{
			idemconnect.WithMaxAttempts(2),
			idemconnect.WithBackoff(func(_ context.Context, n uint) time.Duration { return time.Duration(n) * time.Second }),
		}, []time.Duration{time.Second}},
		{"no backoff", []idemconnect.RetryOption{idemconnect.WithMaxAttempts(3), idemconnect.WithBackoff(nil)}, []time.Duration{0, 0}},
		{"negative backoff", []idemconnect.RetryOption{
			idemconnect.WithMaxAttempts(2),
			idemconnect.WithBackoff(func(context.Context, uint) time.Duration { return -time.Second }),
		}, []time.Duration{0}},
		{"no retries", []idemconnect.RetryOption{idemconnect.WithMaxAttempts(0)}, nil},
	}
	eachProtocol(t, func(t *testing.T, p protocol) {
		for _, c := range cases {
			w := &waits{}
			retry := idemconnect.NewRetryInterceptor(append(c.opts, idemconnect.WithSleep(w.sleep))...)
			arrived := len(e.arrivals.keys())
			_, err := e.payments(p, idemconnect.NewClientInterceptor(), retry).CallUnary(t.Context(), connect.NewRequest(payment(1250)))
			wantCode(t, err, connect.CodeUnavailable)
			seen := since(e.arrivals.keys(), arrived)
			if len(seen) != len(c.waits)+1 || seen[0] == "" || len(slices.Compact(slices.Clone(seen))) != 1 {
				t.Errorf("%s: attempts with keys %q, want %d with one key", c.name, seen, len(c.waits)+1)
			}
			if got := w.all(); !slices.Equal(got, c.waits) {
				t.Errorf("%s: waited %v, want %v", c.name, got, c.waits)
			}
		}
	})
}

// The call's context bounds the retries: a wait that would run past its
// deadline is not begun, and a wait its end interrupts is not followed by
// another attempt. Either way the caller gets the last answer.
func TestRetryStopsAtTheContextsEnd(t *testing.T) {
	e := newEnv(t, setup{
		memory:  true,
		memOpts: []memory.Option{memory.WithLockTimeout(50 * time.Millisecond)},
		opts:    []idem.Option{idem.WithRetryDelay(time.Hour)},
	})
	eachProtocol(t, func(t *testing.T, p protocol) {
		// A duplicate in flight, answered with an hour's RetryInfo, for a
		// caller whose deadline is a minute away.
		entered, release := make(chan struct{}), make(chan struct{})
		e.svc.setHook(func(_ context.Context, run int) error {
			if run%2 == 1 {
				close(entered)
				<-release
			}
			return nil
		})
		key := "deadline-" + p.name
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = e.payments(p).CallUnary(context.Background(), keyed(payment(1250), p.header(key))) })
		t.Cleanup(sync.OnceFunc(func() { close(release); wg.Wait() }))
		<-entered
		w := &waits{}
		client := e.payments(p, idemconnect.NewClientInterceptor(), idemconnect.NewRetryInterceptor(idemconnect.WithSleep(w.sleep)))
		ctx, cancel := context.WithTimeout(idem.ContextWithKey(t.Context(), key), time.Minute)
		defer cancel()
		arrived := len(e.arrivals.keys())
		_, err := client.CallUnary(ctx, connect.NewRequest(payment(1250)))
		ce := wantCode(t, err, connect.CodeAborted)
		if d, ok := idemconnect.RetryDelay(err); !ok || d != time.Hour {
			t.Errorf("RetryDelay(%v) = %v, %v; want 1h", ce, d, ok)
		}
		if seen := since(e.arrivals.keys(), arrived); len(seen) != 1 || len(w.all()) != 0 {
			t.Errorf("%d attempts and waits %v before a deadline a minute away, want 1 attempt and no wait", len(seen), w.all())
		}

		// A handler's ABORTED asks for an hour; the caller gives up during
		// the wait, which the interceptor's own timer makes.
		e.svc.setHook(func(context.Context, int) error {
			return connectErr(t, connect.CodeAborted, "the ledger is being reconciled", time.Hour)
		})
		ctx, cancel = context.WithCancel(t.Context())
		defer cancel()
		giveUp := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				resp, err := next(ctx, req)
				cancel() // once the attempt's answer is in
				return resp, err
			}
		})
		client = e.payments(p, idemconnect.NewClientInterceptor(), idemconnect.NewRetryInterceptor(), giveUp)
		arrived = len(e.arrivals.keys())
		_, err = client.CallUnary(ctx, connect.NewRequest(payment(1250)))
		if ce := wantCode(t, err, connect.CodeAborted); ce.Message() != "the ledger is being reconciled" {
			t.Errorf("got %v, want the last attempt's answer", ce)
		}
		if seen := since(e.arrivals.keys(), arrived); len(seen) != 1 {
			t.Errorf("%d attempts, want 1", len(seen))
		}
	})
}

// Streaming calls pass through, once.
func TestRetryLeavesStreams(t *testing.T) {
	e := newEnv(t, setup{memory: true})
	retry := idemconnect.NewRetryInterceptor(idemconnect.WithSleep((&waits{}).sleep))
	eachProtocol(t, func(t *testing.T, p protocol) {
		before, _ := e.svc.executions()
		client := newClient[testv1.ReadRequest, testv1.ReadResponse](e, p, watch, retry)
		stream, err := client.CallServerStream(t.Context(), connect.NewRequest(&testv1.ReadRequest{Value: "v"}))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for stream.Receive() {
			n++
		}
		if err := stream.Close(); err != nil || stream.Err() != nil || n != 1 {
			t.Errorf("%d messages (%v, %v), want 1", n, stream.Err(), err)
		}
		if runs, _ := e.svc.executions(); runs-before != 1 {
			t.Errorf("%d executions, want 1", runs-before)
		}
	})
}

func TestRetryDelay(t *testing.T) {
	for _, err := range []error{
		nil,
		errors.New("not a Connect error"),
		connect.NewError(connect.CodeAborted, errors.New("no RetryInfo")),
	} {
		if d, ok := idemconnect.RetryDelay(err); ok {
			t.Errorf("RetryDelay(%v) = %v, true; want false", err, d)
		}
	}
	if d, ok := idemconnect.RetryDelay(connectErr(t, connect.CodeUnavailable, "wait", -time.Second)); !ok || d != 0 {
		t.Errorf("a negative RetryInfo: %v, %v; want 0, true", d, ok)
	}
}
