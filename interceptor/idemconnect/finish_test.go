package idemconnect_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
	"github.com/idemkit/idem/transport"
)

// abandoning is a leased CreatePayment whose first execution is abandoned
// by its caller: it waits for its context to end and returns its error, as
// a handler does whose client went away. The others run to completion.
type abandoning struct {
	entered chan struct{} // closed when the first execution has started

	mu        sync.Mutex
	runs      int
	completed int      // executions that ran to the end
	users     []string // x-user-id of each execution
	traces    []string // x-trace-bin of each execution, decoded
}

func (a *abandoning) createPayment(ctx context.Context, req *connect.Request[testv1.CreatePaymentRequest]) (*connect.Response[testv1.CreatePaymentResponse], error) {
	trace, err := connect.DecodeBinaryHeader(req.Header().Get("X-Trace-Bin"))
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	a.mu.Lock()
	a.runs++
	n := a.runs
	a.users = append(a.users, req.Header().Get("X-User-Id"))
	a.traces = append(a.traces, string(trace))
	a.mu.Unlock()
	if n == 1 {
		close(a.entered)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	a.mu.Lock()
	a.completed++
	a.mu.Unlock()
	return connect.NewResponse(&testv1.CreatePaymentResponse{Payment: &testv1.Payment{
		Id:          "pay_" + strconv.Itoa(n),
		CustomerId:  req.Msg.GetCustomerId(),
		AmountCents: req.Msg.GetAmountCents(),
	}}), nil
}

func (a *abandoning) counts() (runs, completed int, users, traces []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs, a.completed, append([]string(nil), a.users...), append([]string(nil), a.traces...)
}

// A Connect-only program has its abandoned calls finished: a leased call
// of a method that may be finished, whose caller went away mid-call, is
// run again by a Finisher through the Connect handler registered with
// FinishHandler, with the request metadata kept with it, and its outcome
// is recorded, so that the caller's retry replays it.
func TestFinishHandlerFinishesAbandonedCalls(t *testing.T) {
	for _, name := range []string{"postgres", "memory"} {
		t.Run(name, func(t *testing.T) {
			var s store.Store = memory.New()
			if name == "postgres" {
				s = postgres.New(pgtest.NewPool(t))
			}
			outcomes := make(chan idem.Report, 10)
			e := idemtest.NewEngine(t, s,
				idem.WithReportHook(func(_ context.Context, o idem.Report) { outcomes <- o }),
				idem.WithMethodPolicy(createPayment, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: 2 * time.Second, Finish: true, FinishHeaders: []string{"x-user-id", "x-trace-bin"}}))
			svc := &abandoning{entered: make(chan struct{})}
			url := serveMux(t, serveMuxFor(createPayment, connect.NewUnaryHandler(createPayment, svc.createPayment,
				connect.WithInterceptors(idemconnect.NewInterceptor(e)))))
			client := connect.NewClient[testv1.CreatePaymentRequest, testv1.CreatePaymentResponse](http.DefaultClient, url+createPayment)
			request := func() *connect.Request[testv1.CreatePaymentRequest] {
				req := keyed(payment(1250), transport.FormatHTTPKey("k1"))
				req.Header().Set("X-User-Id", "u-7")
				req.Header().Set("X-Trace-Bin", connect.EncodeBinaryHeader([]byte{0, 't', 0xff}))
				return req
			}

			// The caller goes away once the call is claimed.
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				_, err := client.CallUnary(ctx, request())
				done <- err
			}()
			select {
			case <-svc.entered:
			case err := <-done:
				t.Fatalf("the call to abandon ended before its handler ran: %v", err)
			}
			cancel()
			if err := <-done; connect.CodeOf(err) != connect.CodeCanceled {
				t.Fatalf("the abandoned call: %v, want it canceled", err)
			}
			// Its handler has returned and its claim is released, kept
			// for the finisher, once idem has settled it.
			if o := <-outcomes; o.Result != idem.ResultTransient || o.Finishing {
				t.Fatalf("the abandoned call's outcome %+v, want transient", o)
			}

			f, err := idem.NewFinisher(e, idem.WithGrace(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			idemconnect.FinishHandler(f, createPayment, svc.createPayment)
			// A pass finishes the call once the grace has passed by the
			// store's clock: passes run until one finishes something.
			var n int
			idemtest.Eventually(20*time.Second, func() bool {
				n, err = f.Finish(t.Context())
				return err != nil || n != 0
			})
			if err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("a pass finished %d calls, want the abandoned one", n)
			}
			if o := <-outcomes; o.Result != idem.ResultExecuted || !o.Finishing {
				t.Errorf("the finisher's run: outcome %+v, want executed, finishing", o)
			}
			runs, completed, users, traces := svc.counts()
			if runs != 2 || completed != 1 {
				t.Fatalf("%d executions, %d to completion; want the abandoned one and the finisher's", runs, completed)
			}
			// The finisher's run got the headers kept with the call as
			// the client sent them.
			if want := []string{"u-7", "u-7"}; users[0] != want[0] || users[1] != want[1] {
				t.Errorf("x-user-id of the executions %q, want %q", users, want)
			}
			if want := string([]byte{0, 't', 0xff}); traces[0] != want || traces[1] != want {
				t.Errorf("x-trace-bin of the executions %q, want %q", traces, want)
			}
			if n, err := f.Finish(t.Context()); n != 0 || err != nil {
				t.Errorf("a second pass finished %d calls (%v), want none", n, err)
			}

			// The caller's retry replays the outcome the finisher recorded.
			resp, err := client.CallUnary(t.Context(), request())
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Msg.GetPayment().GetId(); got != "pay_2" || resp.Header().Get(idem.HTTPReplayedHeader) != "true" {
				t.Errorf("retry: payment %q, replayed %q; want pay_2 replayed", got, resp.Header().Get(idem.HTTPReplayedHeader))
			}
			if runs, _, _, _ := svc.counts(); runs != 2 {
				t.Errorf("%d executions after the retry, want 2", runs)
			}
			if o := <-outcomes; o.Result != idem.ResultReplayed || o.Finishing {
				t.Errorf("the retry: outcome %+v, want replayed", o)
			}
		})
	}
}
