package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
)

// reports keeps how each call went, as "optimistic executed" or "atomic
// replayed": whether its claim read nothing first (Report.Optimistic), and
// its result.
type reports struct {
	mu  sync.Mutex
	all []string
}

func (r *reports) hook(_ context.Context, rep idem.Report) {
	claim := "atomic"
	if rep.Optimistic {
		claim = "optimistic"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, claim+" "+string(rep.Result))
}

func (r *reports) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.all...)
}

// autoSetup serves CreatePayment in idem.ModeAuto on PostgreSQL, keeping
// the reports of its calls in seen.
func autoSetup(seen *reports) setup {
	return setup{opts: []idem.Option{
		idem.WithTenant(idemtest.TenantFromHeader),
		idem.WithMethodPolicy(createPayment, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeAuto}),
		idem.WithReportHook(seen.hook),
	}}
}

// TestAutoClientMarks, on every protocol: in idem.ModeAuto, a call whose
// key the client interceptor made is claimed reading nothing first, and
// the retry interceptor's next attempts reading first, whichever of the
// two comes first in the chain; a call whose key the caller chose, reading
// first. The request's header is left as the caller made it, and each
// call's payment is made once.
func TestAutoClientMarks(t *testing.T) {
	for _, c := range []struct {
		name   string
		flaky  bool
		caller bool
		ics    func() []connect.Interceptor
		want   []string
	}{
		{name: "new key", ics: func() []connect.Interceptor { return []connect.Interceptor{idemconnect.NewClientInterceptor()} },
			want: []string{"optimistic executed"}},
		{name: "caller's key", caller: true, ics: func() []connect.Interceptor { return []connect.Interceptor{idemconnect.NewClientInterceptor()} },
			want: []string{"atomic executed"}},
		{name: "retried", flaky: true, ics: func() []connect.Interceptor {
			return []connect.Interceptor{idemconnect.NewClientInterceptor(), retrying(3)}
		}, want: []string{"optimistic transient", "atomic transient", "atomic executed"}},
		{name: "retried, retry interceptor first", flaky: true, ics: func() []connect.Interceptor {
			return []connect.Interceptor{retrying(3), idemconnect.NewClientInterceptor()}
		}, want: []string{"optimistic transient", "atomic transient", "atomic executed"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			eachProtocol(t, func(t *testing.T, p protocol) {
				var seen reports
				e := newEnv(t, autoSetup(&seen))
				if c.flaky {
					e.svc.setHook(func(_ context.Context, run int) error {
						if run <= 2 {
							return connect.NewError(connect.CodeUnavailable, errors.New("try again"))
						}
						return nil
					})
				}
				ctx := t.Context()
				if c.caller {
					ctx = idem.ContextWithKey(ctx, "mine")
				}
				req := connect.NewRequest(payment(1250))
				if _, err := e.payments(p, c.ics()...).CallUnary(ctx, req); err != nil {
					t.Fatal(err)
				}
				if got := seen.get(); fmt.Sprint(got) != fmt.Sprint(c.want) {
					t.Fatalf("claims taken %q, want %q", got, c.want)
				}
				if v := req.Header().Values(idem.HTTPAttemptHeader); len(v) != 0 {
					t.Fatalf("the caller's request was left with %s %q", idem.HTTPAttemptHeader, v)
				}
				if n := e.paid(t); n != 1 {
					t.Fatalf("%d payments, want 1", n)
				}
			})
		})
	}
}

// TestAutoWrongMarkReplays, on every protocol: a retry marked as a first
// attempt (Idempotency-Attempt: 1) gets the first call's answer, replayed,
// and its payment is rolled back; one marked 2 gets it without running the
// handler.
func TestAutoWrongMarkReplays(t *testing.T) {
	eachProtocol(t, func(t *testing.T, p protocol) {
		var seen reports
		e := newEnv(t, autoSetup(&seen))
		client := e.payments(p)
		call := func(attempt string) *connect.Response[testv1.CreatePaymentResponse] {
			t.Helper()
			req := keyed(payment(1250), p.header("k"))
			req.Header().Set(idem.HTTPAttemptHeader, attempt)
			resp, err := client.CallUnary(t.Context(), req)
			if err != nil {
				t.Fatalf("attempt %s: %v", attempt, err)
			}
			return resp
		}
		first := call("1")
		for _, attempt := range []string{"1", "2"} {
			again := call(attempt)
			if !proto.Equal(again.Msg, first.Msg) || again.Header().Get(idem.HTTPReplayedHeader) != "true" {
				t.Fatalf("retry marked %s got %v, want the first answer %v, replayed", attempt, again.Msg, first.Msg)
			}
		}
		want := []string{"optimistic executed", "optimistic replayed", "atomic replayed"}
		if got := seen.get(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("claims taken %q, want %q", got, want)
		}
		if runs, _ := e.svc.executions(); runs != 2 {
			t.Fatalf("%d executions, want 2 (the first, the wrongly marked retry)", runs)
		}
		if n, k := e.paid(t), e.keys(t); n != 1 || k != 1 {
			t.Fatalf("%d payments, %d keys; want 1, 1", n, k)
		}
	})
}
