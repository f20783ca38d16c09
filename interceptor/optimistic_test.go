package interceptor_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/idemtest/grpctest"
)

// outcomes keeps what a report hook saw.
type outcomes struct {
	mu  sync.Mutex
	all []idem.Report
}

func (o *outcomes) hook(_ context.Context, out idem.Report) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all = append(o.all, out)
}

func (o *outcomes) results(mode idem.Mode) map[idem.Result]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := map[idem.Result]int{}
	for _, out := range o.all {
		if out.Mode == mode {
			n[out.Result]++
		}
	}
	return n
}

// TestOptimisticRetriesReplay calls a method in optimistic mode with a
// fresh key and then retries it: every retry runs the handler, whose write
// is rolled back, and gets the first call's recorded bytes, marked
// replayed; a retry with another request gets the key-reused error.
func TestOptimisticRetriesReplay(t *testing.T) {
	var seen outcomes
	e := newEnv(t, setup{opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic}), idem.WithReportHook(seen.hook)}})
	codec := grpctest.NewRawCodec()
	var header metadata.MD
	first, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.ForceCodecV2(codec), grpc.Header(&header))
	if err != nil {
		t.Fatal(err)
	}
	if got := header.Get(idem.ReplayedHeader); len(got) != 0 {
		t.Fatalf("first response carries %s=%v", idem.ReplayedHeader, got)
	}
	if len(header.Get(idem.ExpiresHeader)) != 1 {
		t.Fatalf("first response carries no %s: %v", idem.ExpiresHeader, header)
	}
	firstBytes := codec.Last()
	if n, k := e.effects(t), e.keys(t); n != 1 || k != 1 {
		t.Fatalf("after the first call: %d effects, %d keys; want 1, 1", n, k)
	}
	const retries = 3
	for i := range retries {
		var header metadata.MD
		again, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.ForceCodecV2(codec), grpc.Header(&header))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(codec.Last(), firstBytes) || !proto.Equal(again, first) {
			t.Fatalf("retry %d got %v, want the first response %v", i+1, again, first)
		}
		if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
			t.Fatalf("retry %d: %s = %v, want [true]", i+1, idem.ReplayedHeader, got)
		}
	}
	_, err = e.client.Do(withKey("k"), &testv1.DoRequest{Value: "other"})
	if st := wantCode(t, err, codes.FailedPrecondition); errorInfo(st).GetReason() != idem.ReasonKeyReused {
		t.Fatalf("ErrorInfo %v, want reason %s", errorInfo(st), idem.ReasonKeyReused)
	}
	// The handler ran for every call, and only the first call's write
	// stands.
	if x, n, k := e.svc.count(), e.effects(t), e.keys(t); x != retries+2 || n != 1 || k != 1 {
		t.Fatalf("%d executions, %d effects, %d keys; want %d, 1, 1", x, n, k, retries+2)
	}
	if got := seen.results(idem.ModeOptimistic); got[idem.ResultExecuted] != 1 || got[idem.ResultReplayed] != retries || got[idem.ResultReused] != 1 {
		t.Fatalf("outcomes in optimistic mode %v, want 1 executed, %d replayed, 1 reused", got, retries)
	}
}

// TestOptimisticErrorIsRecordedAndReplayed records a handler's
// deterministic error in optimistic mode, without its write, and replays
// it to a retry whose handler would now succeed.
func TestOptimisticErrorIsRecordedAndReplayed(t *testing.T) {
	e := newEnv(t, setup{opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic})}})
	e.svc.setHook(func(context.Context, string) error { return status.Error(codes.InvalidArgument, "bad value") })
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	first := wantCode(t, err, codes.InvalidArgument)
	e.svc.setHook(nil)
	var header metadata.MD
	_, err = e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header))
	if again := wantCode(t, err, codes.InvalidArgument); !proto.Equal(again.Proto(), first.Proto()) {
		t.Fatalf("replayed %v, want %v", again.Proto(), first.Proto())
	}
	if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Fatalf("%s = %v, want [true]", idem.ReplayedHeader, got)
	}
	if n, k := e.effects(t), e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE response_code = 3`); n != 0 || k != 1 {
		t.Fatalf("%d effects, %d recorded errors; want 0, 1", n, k)
	}
}

// TestOptimisticDuplicatesShareOneExecution sends concurrent calls with one
// key, every handler running at once: each duplicate's record waits for
// the first to commit, and answers with its response rather than with
// IN_USE; one write stands.
func TestOptimisticDuplicatesShareOneExecution(t *testing.T) {
	const callers = 12
	e := newEnv(t, setup{poolSize: callers, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic})}})
	e.svc.setHook(func(context.Context, string) error {
		if !idemtest.Eventually(30*time.Second, func() bool { return e.svc.count() >= callers }) {
			return status.Error(codes.Internal, "the duplicates never ran")
		}
		return nil
	})
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		executions = map[int64]int{}
	)
	for range callers {
		wg.Go(func() {
			resp, err := e.client.Do(withKey("storm"), &testv1.DoRequest{Value: "v"})
			if err != nil {
				t.Errorf("duplicate: %v, want the shared response", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			executions[resp.GetExecution()]++
		})
	}
	wg.Wait()
	if len(executions) != 1 {
		t.Fatalf("answers came from executions %v, want one shared by all", executions)
	}
	if n, k := e.effects(t), e.keys(t); n != 1 || k != 1 {
		t.Fatalf("%d effects, %d keys; want 1, 1", n, k)
	}
}

// TestOptimisticModeFromTheProto runs a method that the .proto declares
// in optimistic mode (option (idem.v1.method).mode = MODE_OPTIMISTIC): its
// outcomes are reported in that mode, and a retry runs the handler, whose
// write is rolled back, and replays.
func TestOptimisticModeFromTheProto(t *testing.T) {
	var seen outcomes
	e := newEnv(t, setup{opts: []idem.Option{idem.WithReportHook(seen.hook)}})
	for range 2 {
		if _, err := e.client.Optimistic(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := seen.results(idem.ModeOptimistic); got[idem.ResultExecuted] != 1 || got[idem.ResultReplayed] != 1 {
		t.Fatalf("outcomes in optimistic mode %v, want 1 executed, 1 replayed", got)
	}
	if x, n := e.svc.count(), e.effects(t); x != 2 || n != 1 {
		t.Fatalf("%d executions, %d effects; want 2, 1", x, n)
	}
}

// TestOptimisticHandlerFailingOnTheKeyReplays runs a handler in optimistic
// mode whose write has a unique id idemtest.Derived from the key (a unique index on
// effects.key) and which returns the driver's error as it is, UNKNOWN to
// idem's classifier. A retry's write fails with a unique violation, as does
// a concurrent duplicate's once the first call commits: each gets the first
// call's recorded response, marked replayed, and one write stands.
func TestOptimisticHandlerFailingOnTheKeyReplays(t *testing.T) {
	t.Run("retries", func(t *testing.T) {
		var seen outcomes
		e := newEnv(t, setup{opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic}), idem.WithReportHook(seen.hook)}})
		uniqueEffects(t, e)
		codec := grpctest.NewRawCodec()
		first, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.ForceCodecV2(codec))
		if err != nil {
			t.Fatal(err)
		}
		firstBytes := codec.Last()
		const retries = 3
		for i := range retries {
			var header metadata.MD
			again, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.ForceCodecV2(codec), grpc.Header(&header))
			if err != nil {
				t.Fatalf("retry %d: %v, want the first response", i+1, err)
			}
			if !bytes.Equal(codec.Last(), firstBytes) || !proto.Equal(again, first) {
				t.Fatalf("retry %d got %v, want the first response %v", i+1, again, first)
			}
			if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
				t.Fatalf("retry %d: %s = %v, want [true]", i+1, idem.ReplayedHeader, got)
			}
		}
		if x, n, k := e.svc.count(), e.effects(t), e.keys(t); x != retries+1 || n != 1 || k != 1 {
			t.Fatalf("%d executions, %d effects, %d keys; want %d, 1, 1", x, n, k, retries+1)
		}
		if got := seen.results(idem.ModeOptimistic); got[idem.ResultExecuted] != 1 || got[idem.ResultReplayed] != retries {
			t.Fatalf("outcomes in optimistic mode %v, want 1 executed, %d replayed", got, retries)
		}
	})
	t.Run("duplicates", func(t *testing.T) {
		const callers = 8
		e := newEnv(t, setup{poolSize: callers, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic})}})
		uniqueEffects(t, e)
		// Every caller starts its write before the first commits: the
		// duplicates' writes wait for the first's row, then fail.
		e.svc.setHook(func(context.Context, string) error {
			if !idemtest.Eventually(30*time.Second, func() bool { return e.svc.count() >= callers }) {
				return status.Error(codes.Internal, "the duplicates never ran")
			}
			return nil
		})
		var (
			wg         sync.WaitGroup
			mu         sync.Mutex
			executions = map[int64]int{}
		)
		for range callers {
			wg.Go(func() {
				resp, err := e.client.Do(withKey("storm"), &testv1.DoRequest{Value: "v"})
				if err != nil {
					t.Errorf("duplicate: %v, want the shared response", err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				executions[resp.GetExecution()]++
			})
		}
		wg.Wait()
		if len(executions) != 1 {
			t.Fatalf("answers came from executions %v, want one shared by all", executions)
		}
		if n, k := e.effects(t), e.keys(t); n != 1 || k != 1 {
			t.Fatalf("%d effects, %d keys; want 1, 1", n, k)
		}
	})
	t.Run("mapped to ALREADY_EXISTS", func(t *testing.T) {
		// A handler that maps the violation to a deterministic error: the
		// retry answers from the key, having learnt it in one claim, not
		// by recording its own error first.
		tracer := &roundTrips{}
		e := newEnv(t, setup{tracer: tracer, poolSize: 1, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic})}})
		uniqueEffects(t, e)
		e.svc.setHook(nil)
		idle := func() bool { return e.pool.Stat().IdleConns() == 1 }
		var retryTrips, retryCommits int
		for i, key := range []string{"warm", "k"} { // the first warms the statement cache
			if _, err := e.client.Do(withKey(key), &testv1.DoRequest{Value: "v"}); err != nil {
				t.Fatal(err)
			}
			if !idemtest.Eventually(30*time.Second, idle) {
				t.Fatal("the pool's connection never came back")
			}
			tracer.reset()
			resp, err := e.client.Do(withKey(key), &testv1.DoRequest{Value: "v", TraceId: "mapped"})
			if err != nil {
				t.Fatalf("retry of %s: %v, want the first response", key, err)
			}
			if resp.GetExecution() != int64(2*i+1) {
				t.Fatalf("retry of %s answered execution %d, want %d", key, resp.GetExecution(), 2*i+1)
			}
			if !idemtest.Eventually(30*time.Second, idle) {
				t.Fatal("the pool's connection never came back")
			}
			retryTrips, retryCommits = tracer.get()
		}
		// BEGIN, the handler's INSERT, ROLLBACK, the claim, its ROLLBACK.
		if retryTrips != 5 || retryCommits != 0 {
			t.Fatalf("a retry: %d round trips, %d commits; want 5 and 0", retryTrips, retryCommits)
		}

		// A first execution that fails deterministically: BEGIN, the
		// handler's INSERT, ROLLBACK, the claim, the record with COMMIT.
		e.svc.setHook(func(context.Context, string) error { return status.Error(codes.InvalidArgument, "bad value") })
		tracer.reset()
		_, err := e.client.Do(withKey("bad"), &testv1.DoRequest{Value: "v"})
		wantCode(t, err, codes.InvalidArgument)
		if !idemtest.Eventually(30*time.Second, idle) {
			t.Fatal("the pool's connection never came back")
		}
		if trips, commits := tracer.get(); trips != 5 || commits != 1 {
			t.Fatalf("a first execution that fails deterministically: %d round trips, %d commits; want 5 and 1", trips, commits)
		}
		if n, k := e.effects(t), e.keys(t); n != 2 || k != 3 {
			t.Fatalf("%d effects, %d keys; want 2, 3", n, k)
		}
	})
}

// uniqueEffects makes a second write of a key's effect fail with a unique
// violation, which Do returns as it is, or, when the request's trace_id is
// "mapped", as ALREADY_EXISTS.
func uniqueEffects(t *testing.T, e *env) {
	t.Helper()
	if _, err := e.pool.Exec(t.Context(), `CREATE UNIQUE INDEX ON effects (key)`); err != nil {
		t.Fatal(err)
	}
}

// TestOptimisticTransientFailureReleases: a handler that fails with an
// error the classifier calls transient, on a key nobody recorded, answers
// with that error as it is, keeps nothing, and its retry runs afresh.
func TestOptimisticTransientFailureReleases(t *testing.T) {
	var seen outcomes
	e := newEnv(t, setup{opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic}), idem.WithReportHook(seen.hook)}})
	e.svc.setHook(func(context.Context, string) error { return status.Error(codes.Unavailable, "the ledger is down") })
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	if st := wantCode(t, err, codes.Unavailable); st.Message() != "the ledger is down" {
		t.Fatalf("message %q, want the handler's", st.Message())
	}
	if n, k := e.effects(t), e.keys(t); n != 0 || k != 0 {
		t.Fatalf("after a transient failure: %d effects, %d keys; want 0, 0", n, k)
	}
	e.svc.setHook(nil)
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if x, n, k := e.svc.count(), e.effects(t), e.keys(t); x != 2 || n != 1 || k != 1 {
		t.Fatalf("%d executions, %d effects, %d keys; want 2, 1, 1", x, n, k)
	}
	if got := seen.results(idem.ModeOptimistic); got[idem.ResultTransient] != 1 || got[idem.ResultExecuted] != 1 {
		t.Fatalf("outcomes in optimistic mode %v, want 1 transient, 1 executed", got)
	}
}
