package interceptor_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// hookRecorder keeps the outcomes a hook saw.
type hookRecorder struct {
	mu  sync.Mutex
	got []idem.Report
}

func (r *hookRecorder) hook(_ context.Context, o idem.Report) {
	r.mu.Lock()
	r.got = append(r.got, o)
	r.mu.Unlock()
}

func (r *hookRecorder) take() []idem.Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

func TestReportHookSeesEachCallOnce(t *testing.T) {
	rec := &hookRecorder{}
	eachStore(t, setup{opts: []idem.Option{idem.WithReportHook(rec.hook)}}, func(t *testing.T, e *env) {
		rec.take()
		for _, c := range []struct {
			name     string
			call     func() error
			want     idem.Result
			replayed bool
		}{
			{"first call", func() error { _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); return err }, idem.ResultExecuted, false},
			{"retry", func() error { _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); return err }, idem.ResultReplayed, true},
			{"other request", func() error { _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "w"}); return err }, idem.ResultReused, false},
			{"no key", func() error { _, err := e.client.Do(context.Background(), &testv1.DoRequest{Value: "v"}); return err }, idem.ResultMissingKey, false},
			{"bad key", func() error { _, err := e.client.Do(withKey("a b"), &testv1.DoRequest{Value: "v"}); return err }, idem.ResultInvalidKey, false},
			{"optional key absent", func() error {
				_, err := e.client.Maybe(context.Background(), &testv1.MaybeRequest{Value: "v"})
				return err
			}, idem.ResultPassthrough, false},
			{"no side effects", func() error { _, err := e.client.Read(withKey("r"), &testv1.ReadRequest{Value: "v"}); return err }, idem.ResultPassthrough, false},
		} {
			_ = c.call()
			got := rec.take()
			if len(got) != 1 {
				t.Fatalf("%s: the hook saw %d outcomes, want 1: %+v", c.name, len(got), got)
			}
			o := got[0]
			if o.Result != c.want || o.Replayed != c.replayed || o.Mode != idem.ModeAtomic || o.Method == "" {
				t.Errorf("%s: outcome %+v, want result %s, replayed %v, atomic", c.name, o, c.want, c.replayed)
			}
			if c.want == idem.ResultExecuted && (o.ClaimDuration <= 0 || o.RecordDuration <= 0) {
				t.Errorf("%s: claim %v and record %v, want both measured", c.name, o.ClaimDuration, o.RecordDuration)
			}
		}
	})
}

func TestPanickingReportHookLeavesTheAnswer(t *testing.T) {
	hook := func(context.Context, idem.Report) { panic("hook bug") }
	eachStore(t, setup{opts: []idem.Option{idem.WithReportHook(hook)}}, func(t *testing.T, e *env) {
		resp, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
		if err != nil || resp.GetValue() != "v" {
			t.Fatalf("call with a panicking hook: %v, %v", resp, err)
		}
		_, err = e.client.Do(context.Background(), &testv1.DoRequest{Value: "v"})
		wantCode(t, err, codes.InvalidArgument)
		if log := e.log.String(); !strings.Contains(log, "report hook panicked") {
			t.Errorf("the panic was not logged:\n%s", log)
		}
	})
}
