package interceptor_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/idemtest/grpctest"
)

// autoDo puts Do in idem.ModeAuto.
var autoDo = idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeAuto})

// claimsTaken returns, for each report of seen, whether its call's claim
// read nothing (Report.Optimistic) and how it ended.
func (o *outcomes) claimsTaken() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, r := range o.all {
		claim := "atomic"
		if r.Optimistic {
			claim = "optimistic"
		}
		out = append(out, claim+" "+string(r.Result))
	}
	return out
}

// TestAutoClientMarks: in idem.ModeAuto, a call whose key idem's client
// interceptor made is claimed reading nothing first; its retries, by
// go-grpc-middleware's retry interceptor or grpc-go's retryPolicy, reading
// first, though they resend the first attempt's mark; a call whose key the
// caller chose, reading first. Each call's effect happens once.
func TestAutoClientMarks(t *testing.T) {
	flaky := func(svc *testService) {
		var mu sync.Mutex
		failed := false
		svc.setHook(func(context.Context, string) error {
			mu.Lock()
			defer mu.Unlock()
			if !failed {
				failed = true
				return status.Error(codes.Unavailable, "flaky")
			}
			return nil
		})
	}
	for _, c := range []struct {
		name   string
		flaky  bool
		caller bool // the caller sets the key, with ContextWithKey
		dial   []grpc.DialOption
		want   []string
	}{
		{name: "new key", want: []string{"optimistic executed"}},
		{name: "caller's key", caller: true, want: []string{"atomic executed"}},
		{name: "go-grpc-middleware's retry", flaky: true, dial: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			interceptor.UnaryClientInterceptor(),
			retry.UnaryClientInterceptor(retry.WithMax(3), retry.WithCodes(codes.Unavailable), retry.WithBackoff(retry.BackoffLinear(time.Millisecond))),
		)}, want: []string{"optimistic transient", "atomic executed"}},
		{name: "grpc-go's retryPolicy", flaky: true, dial: []grpc.DialOption{
			grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()),
			grpc.WithDefaultServiceConfig(`{"methodConfig": [{
				"name": [{"service": "idem.test.v1.TestService"}],
				"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.01s",
					"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
			}]}`),
		}, want: []string{"optimistic transient", "atomic executed"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool := newEffectsPool(t)
			svc := &testService{pool: pool}
			if c.flaky {
				flaky(svc)
			}
			var seen outcomes
			rec, addr := serve(t, pool, svc, autoDo, idem.WithReportHook(seen.hook))
			dialOpts := c.dial
			if dialOpts == nil {
				dialOpts = []grpc.DialOption{grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor())}
			}
			client := dial(t, addr, dialOpts...)
			ctx := deadline(t, 30*time.Second)
			if c.caller {
				ctx = idem.ContextWithKey(ctx, "mine")
			}
			if _, err := client.Do(ctx, &testv1.DoRequest{Value: "v"}); err != nil {
				t.Fatal(err)
			}
			if got := seen.claimsTaken(); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("claims taken %q, want %q", got, c.want)
			}
			key := onlyKey(t, rec.of(doMethod)[0])
			if n := countEffects(t, pool, key); n != 1 {
				t.Fatalf("%d effects, want 1", n)
			}
		})
	}
}

// TestAutoWrongMarkReplays: a retry that its client wrongly marks as a
// first attempt runs the handler, whose write is rolled back, and gets the
// first call's recorded bytes, replayed; one marked as a retry, or not
// marked, gets them without running the handler. One effect stands.
func TestAutoWrongMarkReplays(t *testing.T) {
	var seen outcomes
	e := newEnv(t, setup{opts: []idem.Option{autoDo, idem.WithReportHook(seen.hook)}})
	codec := grpctest.NewRawCodec()
	call := func(attempt string) (*testv1.DoResponse, []byte, metadata.MD) {
		t.Helper()
		ctx := withKey("k")
		if attempt != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, idem.AttemptHeader, attempt)
		}
		var header metadata.MD
		resp, err := e.client.Do(ctx, &testv1.DoRequest{Value: "v"}, grpc.ForceCodecV2(codec), grpc.Header(&header))
		if err != nil {
			t.Fatalf("attempt %q: %v", attempt, err)
		}
		return resp, codec.Last(), header
	}
	first, firstBytes, _ := call("1")
	for _, attempt := range []string{"1", "2", ""} {
		again, b, header := call(attempt)
		if !bytes.Equal(b, firstBytes) || !proto.Equal(again, first) || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Fatalf("retry marked %q got %v (%v), want the first response %v, replayed", attempt, again, header, first)
		}
	}
	want := []string{"optimistic executed", "optimistic replayed", "atomic replayed", "atomic replayed"}
	if got := seen.claimsTaken(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("claims taken %q, want %q", got, want)
	}
	if x, n, k := e.svc.count(), e.effects(t), e.keys(t); x != 2 || n != 1 || k != 1 {
		t.Fatalf("%d executions, %d effects, %d keys; want 2 (the first, the wrongly marked retry), 1, 1", x, n, k)
	}
}

// TestAutoStormOfFirstAttempts sends 8 concurrent first attempts of each
// of two keys, every handler running at once: each key's effect happens
// once, and every caller of a key gets the same answer.
func TestAutoStormOfFirstAttempts(t *testing.T) {
	const keys, perKey = 2, 8
	e := newEnv(t, setup{poolSize: keys * perKey, opts: []idem.Option{autoDo}})
	e.svc.setHook(func(context.Context, string) error {
		if !idemtest.Eventually(30*time.Second, func() bool { return e.svc.count() >= keys*perKey }) {
			return status.Error(codes.Internal, "the duplicates never ran")
		}
		return nil
	})
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers = map[string]map[int64]int{}
	)
	for k := range keys {
		answers[fmt.Sprintf("storm-%d", k)] = map[int64]int{}
	}
	for k := range keys {
		key := fmt.Sprintf("storm-%d", k)
		for range perKey {
			wg.Go(func() {
				ctx := metadata.AppendToOutgoingContext(withKey(key), idem.AttemptHeader, "1")
				resp, err := e.client.Do(ctx, &testv1.DoRequest{Value: "v"})
				if err != nil {
					t.Errorf("%s: %v, want the shared response", key, err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				answers[key][resp.GetExecution()]++
			})
		}
	}
	wg.Wait()
	for key, by := range answers {
		if len(by) != 1 {
			t.Errorf("%s: answers came from executions %v, want one shared by all", key, by)
		}
		if n := e.countRows(t, `SELECT count(*) FROM effects WHERE key = $1`, key); n != 1 {
			t.Errorf("%s: %d effects, want 1", key, n)
		}
	}
	if k := e.keys(t); k != keys {
		t.Fatalf("%d keys, want %d", k, keys)
	}
}
