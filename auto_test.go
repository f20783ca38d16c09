package idem

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"

	idemv1 "github.com/idemkit/idem/gen/idem/v1"
	"github.com/idemkit/idem/internal/bridge"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// claims is a store that keeps whether each claim asked to read nothing
// (store.ClaimRequest.Optimistic).
type claims struct {
	store.Store
	mu         sync.Mutex
	optimistic []bool
}

func (s *claims) Claim(ctx context.Context, key store.Scope, r store.ClaimRequest) (store.Claim, error) {
	s.mu.Lock()
	s.optimistic = append(s.optimistic, r.Optimistic)
	s.mu.Unlock()
	return s.Store.Claim(ctx, key, r)
}

func (s *claims) taken() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bool(nil), s.optimistic...)
}

// counter is a handler that counts its runs and answers with their number.
type counter struct{ runs atomic.Int64 }

func (h *counter) Run(context.Context) (bridge.Reply, error) {
	n := h.runs.Add(1)
	return bridge.Reply{Message: &testv1.DoResponse{Value: "v", Execution: n}}, nil
}

// autoEngine returns an engine on a memory store that keeps its claims,
// with doMethod in mode, and the reports of its calls.
func autoEngine(t *testing.T, mode Mode) (*Engine, *claims, *[]Report) {
	t.Helper()
	s := &claims{Store: memory.New()}
	var (
		mu      sync.Mutex
		reports []Report
	)
	e, err := New(s, WithMethodPolicy(testv1.TestService_Do_FullMethodName, MethodPolicy{KeyRequired: true, Mode: mode}),
		WithReportHook(func(_ context.Context, r Report) {
			mu.Lock()
			defer mu.Unlock()
			reports = append(reports, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	return e, s, &reports
}

func doCall(key string, header map[string][]string) bridge.Call {
	return bridge.Call{Method: testv1.TestService_Do_FullMethodName, Keys: []string{key}, Request: &testv1.DoRequest{Value: "v"}, Header: header}
}

// TestAutoChoosesTheClaimPerCall: in ModeAuto a call marked as a first
// attempt is claimed reading nothing, and a call marked as a retry, or not
// marked, reading first; ModeAtomic and ModeOptimistic ignore the mark.
// The report says which claim each call took.
func TestAutoChoosesTheClaimPerCall(t *testing.T) {
	first := map[string][]string{AttemptHeader: {"1"}}
	retry := map[string][]string{AttemptHeader: {"2"}}
	grpcRetry := map[string][]string{AttemptHeader: {"1"}, previousAttemptsHeader: {"1"}}
	malformed := map[string][]string{AttemptHeader: {"one"}}
	for _, c := range []struct {
		name   string
		mode   Mode
		header map[string][]string
		want   bool
	}{
		{"auto, first attempt", ModeAuto, first, true},
		{"auto, retry", ModeAuto, retry, false},
		{"auto, grpc-go's retry of a first attempt", ModeAuto, grpcRetry, false},
		{"auto, unmarked", ModeAuto, nil, false},
		{"auto, malformed", ModeAuto, malformed, false},
		{"atomic, first attempt", ModeAtomic, first, false},
		{"optimistic, retry", ModeOptimistic, retry, true},
		{"optimistic, unmarked", ModeOptimistic, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, s, reports := autoEngine(t, c.mode)
			h := &counter{}
			a, err := e.handle(t.Context(), doCall("k", c.header), h)
			if err != nil || a.Result != ResultExecuted {
				t.Fatalf("call: %v, %v; want executed", a.Result, err)
			}
			if got := s.taken(); len(got) != 1 || got[0] != c.want {
				t.Fatalf("claims read nothing: %v, want [%v]", got, c.want)
			}
			if r := (*reports)[0]; r.Mode != c.mode || r.Optimistic != c.want {
				t.Fatalf("report: mode %s, optimistic %v; want %s, %v", r.Mode, r.Optimistic, c.mode, c.want)
			}
			if n := h.runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want 1", n)
			}
		})
	}
}

// TestAutoWrongMarkStillReplays: a retry whose client wrongly marks it as
// a first attempt gets the recorded answer, and the handler does not run
// again; so does one marked as a retry, and one not marked.
func TestAutoWrongMarkStillReplays(t *testing.T) {
	e, _, reports := autoEngine(t, ModeAuto)
	h := &counter{}
	first, err := e.handle(t.Context(), doCall("k", map[string][]string{AttemptHeader: {"1"}}), h)
	if err != nil {
		t.Fatal(err)
	}
	for _, header := range []map[string][]string{{AttemptHeader: {"1"}}, {AttemptHeader: {"2"}}, nil} {
		again, err := e.handle(t.Context(), doCall("k", header), h)
		if err != nil || again.Result != ResultReplayed || !proto.Equal(again.Message, first.Message) {
			t.Fatalf("retry with %v: %v, %v, %v; want the first answer %v, replayed", header, again.Message, again.Result, err, first.Message)
		}
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if len(*reports) != 4 || !(*reports)[1].Optimistic || (*reports)[2].Optimistic || (*reports)[3].Optimistic {
		t.Fatalf("reports %+v; want the wrongly marked retry claimed reading nothing, the others reading first", *reports)
	}
}

// TestAutoStormOfFirstAttempts sends 8 concurrent first attempts of each
// of 4 keys: each key's handler runs once, and every caller of a key gets
// that run's answer.
func TestAutoStormOfFirstAttempts(t *testing.T) {
	e, _, _ := autoEngine(t, ModeAuto)
	const keys, perKey = 4, 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers = map[string]map[int64]int{}
		runs    [keys]counter
	)
	for k := range keys {
		answers[string(rune('a'+k))] = map[int64]int{}
	}
	for k := range keys {
		key := string(rune('a' + k))
		for range perKey {
			wg.Go(func() {
				a, err := e.handle(context.Background(), doCall(key, map[string][]string{AttemptHeader: {"1"}}), &runs[k])
				if err != nil {
					t.Errorf("key %s: %v", key, err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				answers[key][a.Message.(*testv1.DoResponse).GetExecution()]++
			})
		}
	}
	wg.Wait()
	for k := range keys {
		key := string(rune('a' + k))
		if n := runs[k].runs.Load(); n != 1 || len(answers[key]) != 1 || answers[key][1] != perKey {
			t.Errorf("key %s: the handler ran %d times, answers by run %v; want 1 run whose answer all %d callers got", key, n, answers[key], perKey)
		}
	}
}

// TestAutoIsAMode: New takes ModeAuto, from WithMethodPolicy and from the
// .proto's option, and names it among the modes when refusing one it does
// not know.
func TestAutoIsAMode(t *testing.T) {
	if _, err := New(memory.New(), WithMethodPolicy(testv1.TestService_Do_FullMethodName, MethodPolicy{Mode: ModeAuto})); err != nil {
		t.Fatalf("New with ModeAuto: %v", err)
	}
	_, err := New(memory.New(), WithMethodPolicy(testv1.TestService_Do_FullMethodName, MethodPolicy{Mode: "AUTO"}))
	if err == nil || !strings.Contains(err.Error(), `Mode "AUTO"`) || !strings.Contains(err.Error(), string(ModeAuto)) {
		t.Fatalf("New with Mode AUTO: %v; want an error naming it and listing %s", err, ModeAuto)
	}
	// Every value of the option's enum but MODE_UNSPECIFIED is a mode.
	for v, name := range idemv1.Mode_name {
		if m, ok := protoModes[idemv1.Mode(v)]; ok == (v == 0) || (ok && "MODE_"+strings.ToUpper(string(m)) != name) {
			t.Errorf("%s is mode %q", name, m)
		}
	}
}
