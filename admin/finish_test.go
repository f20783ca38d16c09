package admin_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/admin"
	"github.com/idemkit/idem/fingerprint"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// flaky is a Do whose first two runs fail transiently, as a call whose
// provider's quota was spent; the runs after them succeed.
type flaky struct {
	testv1.UnimplementedTestServiceServer
	runs atomic.Int64
}

func (f *flaky) Do(_ context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	n := f.runs.Add(1)
	if n <= 2 {
		return nil, status.Error(codes.ResourceExhausted, "the provider's quota is spent")
	}
	return &testv1.DoResponse{Value: req.GetValue(), Execution: n}, nil
}

// TestFinishKey drives FinishKey over store/memory, on each wire, with a
// grpc-go handler: a leased, finishable call whose handler failed
// transiently is left abandoned; FinishKey runs it through the finisher,
// at once rather than after the finisher's grace: the first attempt fails
// again and is answered with the handler's code and message (read from
// the handler's gRPC status, whichever the admin service's wire), the
// second answers with its recorded response; the caller's retry replays
// it. A third FinishKey finds nothing to finish; a live lease and a call
// of a method that does not opt in are refused, saying why; a server
// without a finisher answers UNIMPLEMENTED.
func TestFinishKey(t *testing.T) {
	onEachWire(t, testFinishKey)
}

func testFinishKey(t *testing.T, w wire) {
	var (
		mu  sync.Mutex
		now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	st := memory.New(memory.WithClock(clock))
	engine, err := idem.New(st, idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute, Finish: true}))
	if err != nil {
		t.Fatal(err)
	}
	// The default grace (30 s) has not passed on the store's clock when
	// FinishKey runs: only FinishKey can finish the call here.
	f, err := idem.NewFinisher(engine)
	if err != nil {
		t.Fatal(err)
	}
	svc := &flaky{}
	testv1.RegisterTestServiceServer(interceptor.FinisherRegistrar(f), svc)

	s := grpc.NewServer(grpc.UnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))
	testv1.RegisterTestServiceServer(s, svc)
	do := testv1.NewTestServiceClient(dialServer(t, s))
	ctx := t.Context()
	keyed := metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, "order-7")

	_, err = do.Do(keyed, &testv1.DoRequest{Value: "pay 7"})
	wantCode(t, err, codes.ResourceExhausted)

	client := w.serve(t, st, allowAll, admin.WithFinisher(f))
	k := &adminv1.FinishKeyRequest{Method: doMethod, Key: "order-7", Reason: "the customer called"}
	got, err := client.GetKey(ctx, &adminv1.GetKeyRequest{Method: doMethod, Key: "order-7"})
	if err != nil || got.GetKey().GetState() != adminv1.KeyState_KEY_STATE_ABANDONED || !got.GetKey().GetFinishable() {
		t.Fatalf("GetKey: %v, %v; want it abandoned and finishable", got, err)
	}
	if n, err := f.Finish(ctx); n != 0 || err != nil {
		t.Fatalf("a pass within the grace finished %d calls (%v), want none", n, err)
	}

	_, err = client.FinishKey(ctx, k)
	if msg := wantCode(t, err, codes.ResourceExhausted); !strings.Contains(msg, "recorded no outcome") || !strings.Contains(msg, "the provider's quota is spent") {
		t.Fatalf("FinishKey of a call that fails again: %q, want it to say the attempt recorded nothing, and why", msg)
	}
	got, err = client.GetKey(ctx, &adminv1.GetKeyRequest{Method: doMethod, Key: "order-7"})
	if err != nil || got.GetKey().GetState() != adminv1.KeyState_KEY_STATE_ABANDONED || !got.GetKey().GetFinishable() {
		t.Fatalf("GetKey after a failed finish: %v, %v; want it abandoned and finishable", got, err)
	}
	fin, err := client.FinishKey(ctx, k)
	if err != nil {
		t.Fatalf("FinishKey: %v", err)
	}
	if n := svc.runs.Load(); n != 3 {
		t.Fatalf("the handler ran %d times, want 3: the failed call and two finishes", n)
	}
	out := fin.GetKey().GetOutcome()
	if fin.GetKey().GetState() != adminv1.KeyState_KEY_STATE_RECORDED || out.GetCode() != 0 ||
		out.GetResponseType() != "idem.test.v1.DoResponse" ||
		out.GetResponse().GetStructValue().GetFields()["value"].GetStringValue() != "pay 7" {
		t.Fatalf("FinishKey answered %v; want the key recorded with the finished call's response", fin)
	}
	// Only the finish that recorded an outcome is in the audit trail.
	hist, err := client.ListAudit(ctx, &adminv1.ListAuditRequest{Method: doMethod, Key: "order-7"})
	if es := hist.GetEntries(); err != nil || len(es) != 1 || es[0].GetAction() != adminv1.AuditAction_AUDIT_ACTION_FINISH ||
		es[0].GetStateBefore() != adminv1.KeyState_KEY_STATE_ABANDONED || es[0].GetStateAfter() != adminv1.KeyState_KEY_STATE_RECORDED ||
		es[0].GetReason() != "the customer called" {
		t.Fatalf("the key's history after the finish: %v, %v; want the finish, abandoned to recorded, with its reason", hist, err)
	}

	var header metadata.MD
	resp, err := do.Do(keyed, &testv1.DoRequest{Value: "pay 7"}, grpc.Header(&header))
	if err != nil || resp.GetExecution() != 3 || header.Get(idem.ReplayedHeader)[0] != "true" {
		t.Fatalf("retry: %v, %v, header %v; want the finished response replayed", resp, err, header)
	}
	if n := svc.runs.Load(); n != 3 {
		t.Fatalf("the handler ran %d times after the retry, want 3", n)
	}

	_, err = client.FinishKey(ctx, k)
	if msg := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(msg, "nothing to finish") {
		t.Fatalf("FinishKey of a recorded key: %q, want it to say there is nothing to finish", msg)
	}

	// A live lease: its caller may still record an outcome.
	live := store.Scope{Method: doMethod, Key: "order-8"}
	lc, err := st.ClaimLeased(ctx, live, store.LeaseRequest{Fingerprint: []byte("fp"), Call: &store.Call{Method: doMethod}, Lease: time.Minute})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease: %+v, %v", lc, err)
	}
	_, err = client.FinishKey(ctx, &adminv1.FinishKeyRequest{Method: doMethod, Key: "order-8"})
	if msg := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(msg, "2026-01-02T03:05:05") {
		t.Fatalf("FinishKey of a live lease: %q, want the lease's end named", msg)
	}

	// An abandoned call of which nothing was kept for a finisher.
	kept := store.Scope{Method: "/shop.v1.Shop/Checkout", Key: "order-9"}
	if lc, err := st.ClaimLeased(ctx, kept, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute}); err != nil || lc.Lease == nil {
		t.Fatalf("lease: %+v, %v", lc, err)
	}
	advance(2 * time.Minute)
	_, err = client.FinishKey(ctx, &adminv1.FinishKeyRequest{Method: kept.Method, Key: kept.Key})
	if msg := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(msg, "does not opt in to finish") {
		t.Fatalf("FinishKey of a call not kept: %q, want it to say the method does not opt in", msg)
	}

	_, err = client.FinishKey(ctx, &adminv1.FinishKeyRequest{Method: doMethod, Key: "order-404"})
	wantCode(t, err, codes.NotFound)

	_, err = w.serve(t, st, allowAll).FinishKey(ctx, k)
	wantCode(t, err, codes.Unimplemented)
	if n := svc.runs.Load(); n != 3 {
		t.Fatalf("the handler ran %d times in all, want 3", n)
	}

	// FinishKeys over the abandoned keys, one a call: order-10 (its lease
	// ran out, its call kept) is finished; order-8, whose kept call is not
	// the request its fingerprint is of, and order-9, not kept, are
	// skipped, saying why.
	req10 := &testv1.DoRequest{Value: "pay 10"}
	fp10, err := fingerprint.Sum(req10)
	if err != nil {
		t.Fatal(err)
	}
	body10, err := proto.Marshal(req10)
	if err != nil {
		t.Fatal(err)
	}
	if lc, err := st.ClaimLeased(ctx, store.Scope{Method: doMethod, Key: "order-10"}, store.LeaseRequest{Fingerprint: fp10,
		Call: &store.Call{Method: doMethod, Request: body10}, Lease: time.Minute}); err != nil || lc.Lease == nil {
		t.Fatalf("lease: %+v, %v", lc, err)
	}
	advance(2 * time.Minute)
	sel := &adminv1.KeySelection{States: []adminv1.KeyState{adminv1.KeyState_KEY_STATE_ABANDONED}}
	dry, err := client.FinishKeys(ctx, &adminv1.FinishKeysRequest{Selection: sel, Limit: 10, DryRun: true, Reason: "after the outage"})
	if b := dry.GetBatch(); err != nil || b.GetCount() != 3 || len(b.GetSample()) != 3 || len(b.GetResults()) != 0 || svc.runs.Load() != 3 {
		t.Fatalf("FinishKeys dry run: %v, %v; want a count of 3, a sample of 3, and nothing run", dry, err)
	}
	var results []*adminv1.KeyResult
	for token := ""; ; {
		resp, err := client.FinishKeys(ctx, &adminv1.FinishKeysRequest{Selection: sel, Limit: 1, Reason: "after the outage", PageToken: token})
		if err != nil {
			t.Fatalf("FinishKeys: %v", err)
		}
		results = append(results, resp.GetBatch().GetResults()...)
		if token = resp.GetBatch().GetNextPageToken(); token == "" {
			break
		}
	}
	if len(results) != 3 || results[0].GetKey() != "order-8" || results[0].GetOutcome() != adminv1.KeyResult_OUTCOME_SKIPPED ||
		!strings.Contains(results[0].GetStatus().GetMessage(), "different request") ||
		results[1].GetKey() != "order-9" || results[1].GetOutcome() != adminv1.KeyResult_OUTCOME_SKIPPED ||
		!strings.Contains(results[1].GetStatus().GetMessage(), "does not opt in to finish") ||
		results[2].GetKey() != "order-10" || results[2].GetOutcome() != adminv1.KeyResult_OUTCOME_DONE {
		t.Fatalf("FinishKeys' results: %v; want order-8 and order-9 skipped, saying why, and order-10 done", results)
	}
	if n := svc.runs.Load(); n != 4 {
		t.Fatalf("the handler ran %d times in all, want 4", n)
	}
	hist, err = client.ListAudit(ctx, &adminv1.ListAuditRequest{Method: doMethod, Key: "order-10"})
	if es := hist.GetEntries(); err != nil || len(es) != 1 || es[0].GetAction() != adminv1.AuditAction_AUDIT_ACTION_FINISH || es[0].GetReason() != "after the outage" {
		t.Fatalf("order-10's history: %v, %v; want its finish, with the reason", hist, err)
	}
	if hist, err := client.ListAudit(ctx, &adminv1.ListAuditRequest{Method: doMethod, Key: "order-8"}); err != nil || len(hist.GetEntries()) != 0 {
		t.Fatalf("order-8's history: %v, %v; want none: it was skipped", hist, err)
	}
	_, err = w.serve(t, st, allowAll).FinishKeys(ctx, &adminv1.FinishKeysRequest{Selection: sel, Limit: 1, Reason: "r"})
	wantCode(t, err, codes.Unimplemented)
}
