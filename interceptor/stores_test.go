package interceptor_test

import (
	"bytes"
	"context"
	"strings"
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
)

// eachStore runs f on a server of each store: PostgreSQL, and store/memory,
// whose cases need no database and so also run under go test -short. The
// contract at the wire is the same; only the PostgreSQL store can undo the
// handler's writes (its effects rows), so on store/memory the effects of a
// case are its executions.
func eachStore(t *testing.T, s setup, f func(t *testing.T, e *env)) {
	t.Helper()
	for _, mem := range []bool{false, true} {
		name := "postgres"
		if mem {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) {
			s := s
			s.memory = mem
			f(t, newEnv(t, s))
		})
	}
}

func TestStoresRunOnceAndReplay(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		codec := newRawCodec()
		req := &testv1.DoRequest{Value: "v"}
		first, err := e.client.Do(withKey("k"), req, grpc.ForceCodecV2(codec))
		if err != nil {
			t.Fatal(err)
		}
		firstBytes := codec.last()
		var header metadata.MD
		again, err := e.client.Do(withKey("k"), req, grpc.ForceCodecV2(codec), grpc.Header(&header))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(codec.last(), firstBytes) || !proto.Equal(first, again) {
			t.Errorf("replay differs from the first response")
		}
		if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
			t.Errorf("replay header %v, want true", got)
		}
		if n := e.svc.count(); n != 1 {
			t.Errorf("%d executions, want 1", n)
		}
		if n := e.effects(t); n != 1 {
			t.Errorf("%d effects, want 1", n)
		}
	})
}

func TestStoresKeyReusedWithAnotherRequest(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
			t.Fatal(err)
		}
		_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "other"})
		st := wantCode(t, err, codes.FailedPrecondition)
		if info := errorInfo(st); info.GetReason() != idem.ReasonKeyReused {
			t.Errorf("reason %q, want %s", info.GetReason(), idem.ReasonKeyReused)
		}
		if n := e.svc.count(); n != 1 {
			t.Errorf("%d executions, want 1", n)
		}
	})
}

func TestStoresDeterministicErrorIsReplayed(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		e.svc.setHook(func(context.Context, string) error {
			return status.Error(codes.InvalidArgument, "amount must be positive")
		})
		_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
		wantCode(t, err, codes.InvalidArgument)
		var header metadata.MD
		_, err = e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header))
		if st := wantCode(t, err, codes.InvalidArgument); st.Message() != "amount must be positive" {
			t.Errorf("replayed message %q", st.Message())
		}
		if got := header.Get(idem.ReplayedHeader); len(got) != 1 {
			t.Errorf("the recorded error was not replayed (header %v)", got)
		}
		if n := e.svc.count(); n != 1 {
			t.Errorf("%d executions, want 1", n)
		}
		if e.pool != nil && e.effects(t) != 0 {
			t.Errorf("the handler's writes stayed with a recorded error")
		}
	})
}

func TestStoresTransientErrorReleasesTheKey(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		var mu sync.Mutex
		fail := true
		e.svc.setHook(func(context.Context, string) error {
			mu.Lock()
			defer mu.Unlock()
			if fail {
				fail = false
				return status.Error(codes.Unavailable, "blip")
			}
			return nil
		})
		_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
		wantCode(t, err, codes.Unavailable)
		resp, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
		if err != nil {
			t.Fatalf("retry after a transient error: %v", err)
		}
		if resp.GetExecution() != 2 || e.svc.count() != 2 {
			t.Errorf("retry answered execution %d after %d executions, want a second execution", resp.GetExecution(), e.svc.count())
		}
		if e.pool != nil && e.effects(t) != 1 {
			t.Errorf("%d effects, want only the retry's", e.effects(t))
		}
	})
}

func TestStoresConcurrentDuplicatesRunOnce(t *testing.T) {
	eachStore(t, setup{}, concurrentDuplicatesRunOnce)
}

// concurrentDuplicatesRunOnce sends 20 concurrent calls with one key to e.
func concurrentDuplicatesRunOnce(t *testing.T, e *env) {
	const callers = 20
	// Hold the first execution until every duplicate has reached the
	// server while it is in flight.
	e.svc.setHook(func(context.Context, string) error {
		if !idemtest.Eventually(30*time.Second, func() bool { return e.svc.arrived.Load() >= callers }) {
			return status.Error(codes.Internal, "the duplicates never arrived")
		}
		return nil
	})
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && status.Code(err) != codes.Aborted {
			t.Errorf("duplicate got %v, want OK or ABORTED", err)
		}
		if err != nil && retryDelay(err) == nil {
			t.Errorf("ABORTED without RetryInfo: %v", err)
		}
	}
	if n := e.svc.count(); n != 1 {
		t.Errorf("%d executions of 20 duplicates, want 1", n)
	}
}

func TestStoresInvalidKeysNeverRun(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		for name, ctx := range map[string]context.Context{
			"missing where required": context.Background(),
			"too long":               withKey(strings.Repeat("k", 256)),
			"empty":                  withKey(""),
		} {
			_, err := e.client.Do(ctx, &testv1.DoRequest{Value: "v"})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
			}
		}
		if n := e.svc.count(); n != 0 {
			t.Errorf("%d executions, want none", n)
		}
	})
}

func TestStoresScopeKeysByTenant(t *testing.T) {
	eachStore(t, setup{}, func(t *testing.T, e *env) {
		for _, tenant := range []string{"acme", "globex"} {
			ctx := metadata.AppendToOutgoingContext(withKey("k"), "x-tenant-id", tenant)
			if _, err := e.client.Do(ctx, &testv1.DoRequest{Value: "v"}); err != nil {
				t.Fatal(err)
			}
		}
		if n := e.svc.count(); n != 2 {
			t.Errorf("%d executions for one key in two tenants, want 2", n)
		}
	})
}

func TestStoresLeasedRunOnceAndReplay(t *testing.T) {
	s := setup{opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute})}}
	eachStore(t, s, func(t *testing.T, e *env) {
		first, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
		if err != nil {
			t.Fatal(err)
		}
		again, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
		if err != nil || !proto.Equal(first, again) {
			t.Fatalf("leased retry: %v, %v; want the first answer", again, err)
		}
		if n := e.svc.count(); n != 1 {
			t.Errorf("%d executions, want 1", n)
		}
	})
}
