package interceptor_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

const maybeMethod = testv1.TestService_Maybe_FullMethodName

// valueLoader records a Maybe response as its value and rebuilds it from
// the effects table, counting loads.
type valueLoader struct {
	e     **env
	loads atomic.Int32
}

func (l *valueLoader) Reference(_ context.Context, resp proto.Message) ([]byte, error) {
	return []byte(resp.(*testv1.MaybeResponse).GetValue()), nil
}

func (l *valueLoader) Load(ctx context.Context, ref []byte) (proto.Message, error) {
	l.loads.Add(1)
	var n int64
	if err := (*l.e).pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE value = $1`, string(ref)).Scan(&n); err != nil {
		return nil, err
	}
	return &testv1.MaybeResponse{Value: string(ref), Execution: n}, nil
}

var big = strings.Repeat("x", 100)

func TestOversizedResponseWithLoader(t *testing.T) {
	var e *env
	loader := &valueLoader{e: &e}
	e = newEnv(t, setup{opts: []idem.Option{
		idem.WithMaxStoredResponseBytes(64),
		idem.WithMethodPolicy(maybeMethod, idem.MethodPolicy{Loader: loader}),
	}})
	first, err := e.client.Maybe(withKey("k"), &testv1.MaybeRequest{Value: big})
	if err != nil || first.GetValue() != big {
		t.Fatalf("first call: %v, %v", first, err)
	}
	// The row keeps the reference, not the response.
	if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE response_not_cached AND response = $1`, []byte(big)); got != 1 {
		t.Fatal("no not-cached row holding the loader's reference")
	}
	var header metadata.MD
	again, err := e.client.Maybe(withKey("k"), &testv1.MaybeRequest{Value: big}, grpc.Header(&header))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, again) || loader.loads.Load() != 1 || header.Get(idem.ReplayedHeader)[0] != "true" {
		t.Fatalf("retry = %v (loads %d, header %v), want %v rebuilt once", again, loader.loads.Load(), header, first)
	}
	if got := e.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	// Responses under the cap are recorded as they are.
	if _, err := e.client.Maybe(withKey("small"), &testv1.MaybeRequest{Value: "s"}); err != nil {
		t.Fatal(err)
	}
	if got := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE key = 'small' AND NOT response_not_cached`); got != 1 {
		t.Fatal("a small response was not cached")
	}
}

func TestOversizedResponseWithoutLoader(t *testing.T) {
	e := newEnv(t, setup{opts: []idem.Option{idem.WithMaxStoredResponseBytes(64)}})
	if _, err := e.client.Maybe(withKey("k"), &testv1.MaybeRequest{Value: big}); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.Maybe(withKey("k"), &testv1.MaybeRequest{Value: big})
	wantCode(t, err, codes.FailedPrecondition)
	if reason(err) != idem.ReasonResponseNotCached {
		t.Fatalf("reason = %q", reason(err))
	}
	if got := e.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1: the retry must not run silently", got)
	}
}

func TestOversizedResponseRerun(t *testing.T) {
	e := newEnv(t, setup{opts: []idem.Option{
		idem.WithMaxStoredResponseBytes(64),
		idem.WithMethodPolicy(maybeMethod, idem.MethodPolicy{RerunWhenNotCached: true}),
	}})
	for range 2 {
		if _, err := e.client.Maybe(withKey("k"), &testv1.MaybeRequest{Value: big}); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.effects(t); got != 2 {
		t.Fatalf("effects = %d, want 2: a method declared safe to rerun runs again", got)
	}
	if got := e.keys(t); got != 1 {
		t.Fatalf("key rows = %d, want 1", got)
	}
}
