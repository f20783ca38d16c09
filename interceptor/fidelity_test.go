package interceptor_test

import (
	"context"
	"io"
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
