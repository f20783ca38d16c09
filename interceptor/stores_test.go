package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
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
	idemtest.EachStore(t, func(t *testing.T, mem bool) {
		s := s
		s.memory = mem
		f(t, newEnv(t, s))
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
