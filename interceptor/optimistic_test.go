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
)

// outcomes keeps what an outcome hook saw.
type outcomes struct {
	mu  sync.Mutex
	all []idem.Outcome
}

func (o *outcomes) hook(_ context.Context, out idem.Outcome) {
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
	e := newEnv(t, setup{opts: []idem.Option{idem.WithOptimistic(doMethod), idem.WithOutcomeHook(seen.hook)}})
	codec := newRawCodec()
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
	firstBytes := codec.last()
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
		if !bytes.Equal(codec.last(), firstBytes) || !proto.Equal(again, first) {
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
	e := newEnv(t, setup{opts: []idem.Option{idem.WithOptimistic(doMethod)}})
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
	e := newEnv(t, setup{poolSize: callers, opts: []idem.Option{idem.WithOptimistic(doMethod)}})
	e.svc.setHook(func(context.Context, string) error {
		if !eventually(30*time.Second, func() bool { return e.svc.count() >= callers }) {
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
	e := newEnv(t, setup{opts: []idem.Option{idem.WithOutcomeHook(seen.hook)}})
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
