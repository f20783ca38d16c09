package interceptor_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// wantExpires fails the test unless md says the key expires at about want.
func wantExpires(t *testing.T, md metadata.MD, want time.Time) time.Time {
	t.Helper()
	v := md.Get(idem.ExpiresHeader)
	if len(v) != 1 {
		t.Fatalf("%s = %v, want one value", idem.ExpiresHeader, v)
	}
	got, err := time.Parse(time.RFC3339, v[0])
	if err != nil {
		t.Fatalf("%s = %q: %v", idem.ExpiresHeader, v[0], err)
	}
	if d := got.Sub(want).Abs(); d > 5*time.Second {
		t.Errorf("%s = %v, %v from %v", idem.ExpiresHeader, got, d, want)
	}
	return got
}

// The headers and trailers a handler sets are recorded with its outcome
// and replayed with it, with a response or an error; the key's expiry is
// told on the first answer and on every replay.
func TestResponseMetadataIsReplayed(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		e.svc.setHook(func(ctx context.Context, value string) error {
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-charge-id", "ch_1", "x-multi", "a", "x-multi", "b"))
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "l-9"))
			if value == "bad" {
				return status.Error(codes.InvalidArgument, "bad value")
			}
			return nil
		})
		for _, value := range []string{"ok", "bad"} {
			key := "k-" + value
			var h1, t1, h2, t2 metadata.MD
			_, err1 := e.client.Do(withKey(key), &testv1.DoRequest{Value: value}, grpc.Header(&h1), grpc.Trailer(&t1))
			_, err2 := e.client.Do(withKey(key), &testv1.DoRequest{Value: value}, grpc.Header(&h2), grpc.Trailer(&t2))
			if status.Code(err1) != status.Code(err2) {
				t.Fatalf("%s: first %v, replay %v", value, err1, err2)
			}
			if got := h2.Get(idem.ReplayedHeader); len(got) != 1 {
				t.Fatalf("%s: the second call was not a replay (%v)", value, h2)
			}
			for _, k := range []string{"x-charge-id", "x-multi"} {
				if a, b := h1.Get(k), h2.Get(k); len(a) == 0 || !equal(a, b) {
					t.Errorf("%s: header %s first %v, replayed %v", value, k, a, b)
				}
			}
			if a, b := t1.Get("x-ledger"), t2.Get("x-ledger"); len(a) != 1 || !equal(a, b) {
				t.Errorf("%s: trailer x-ledger first %v, replayed %v", value, a, b)
			}
			first := wantExpires(t, h1, time.Now().Add(24*time.Hour))
			if again := wantExpires(t, h2, first); !again.Equal(first) {
				t.Errorf("%s: the replay says the key expires at %v, the first answer %v", value, again, first)
			}
		}
		if n := e.svc.count(); n != 2 {
			t.Errorf("%d executions, want 2", n)
		}
	})
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A request field marked (idem.v1.field).key carries the key when the
// metadata does not; the two must agree when both do.
func TestKeyFromRequestField(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		req := &testv1.DoRequest{Value: "v", RequestId: "req-1"}
		if _, err := e.client.Do(context.Background(), req); err != nil {
			t.Fatalf("key in the request only: %v", err)
		}
		var header metadata.MD
		if _, err := e.client.Do(context.Background(), req, grpc.Header(&header)); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Fatalf("retry with the key in the request: %v (header %v), want a replay", err, header)
		}
		header = nil
		if _, err := e.client.Do(withKey("req-1"), req, grpc.Header(&header)); err != nil || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Fatalf("retry with the same key in both: %v, want a replay", err)
		}
		_, err := e.client.Do(withKey("other"), req)
		if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), "request_id") {
			t.Errorf("conflicting keys: %q does not name the field", st.Message())
		}
		_, err = e.client.Do(context.Background(), &testv1.DoRequest{Value: "v", RequestId: "not a key"})
		wantCode(t, err, codes.InvalidArgument)
		if n := e.svc.count(); n != 1 {
			t.Errorf("%d executions, want 1", n)
		}
	})
}

// A method's scope names its keys instead of its full name, and its TTL
// overrides the store's.
func TestMethodScopeAndTTL(t *testing.T) {
	clock := &testClock{}
	eachStore(t, setup{memoryStore: memory.New(memory.WithClock(clock.now))}, func(t *testing.T, e *env) {
		var child string
		e.svc.setHook(func(ctx context.Context, _ string) error {
			child, _ = idem.ChildKey(ctx, "step")
			return nil
		})
		var header metadata.MD
		start := time.Now()
		if _, err := e.client.Renamed(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header)); err != nil {
			t.Fatal(err)
		}
		wantExpires(t, header, start.Add(time.Second))
		if want := idemtest.StepKey(store.Scope{Method: "idem.test.Do", Key: "k"}, "step"); child != want {
			t.Errorf("child key %s, want %s, idemtest.Derived from the method's scope", child, want)
		}
		if e.pool != nil {
			if n := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE method = 'idem.test.Do' AND key = 'k'`); n != 1 {
				t.Errorf("%d rows under the scope, want 1", n)
			}
		}
		// Let the key expire: on PostgreSQL by the database's clock, on
		// store/memory by moving its clock past the second.
		if e.pool != nil {
			idemtest.WaitFor(t, 10*time.Second, func() bool {
				return e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE method = 'idem.test.Do' AND key = 'k' AND expires_at < now()`) == 1
			})
		} else {
			clock.advance(1300 * time.Millisecond)
		}
		if _, err := e.client.Renamed(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
			t.Fatal(err)
		}
		if n := e.svc.count(); n != 2 {
			t.Errorf("%d executions, want 2: the key should have expired after a second", n)
		}
	})
}

// A key on a streaming call is refused, not ignored.
func TestStreamsRefuseKeys(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		recv := func(ctx context.Context) error {
			stream, err := e.client.Watch(ctx, &testv1.DoRequest{Value: "v"})
			if err != nil {
				return err
			}
			for {
				if _, err := stream.Recv(); err != nil {
					if err == io.EOF {
						return nil
					}
					return err
				}
			}
		}
		if err := recv(withKey("k")); status.Code(err) != codes.InvalidArgument {
			t.Errorf("keyed stream: %v, want INVALID_ARGUMENT", err)
		}
		if err := recv(context.Background()); err != nil {
			t.Errorf("stream without a key: %v", err)
		}
	})
}
