package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
)

// countingStore is a store that counts replays and shows them.
type countingStore interface {
	store.Store
	store.ReplayCounter
	store.Admin
}

// TestStoresCountReplays: every call answered from a key's record, a
// response or a recorded error, adds one to the key's replays once the
// store flushes them; the first execution and a reused key do not, and
// with WithReplayCounts(false) nothing does.
func TestStoresCountReplays(t *testing.T) {
	for _, counted := range []bool{true, false} {
		name := "counted"
		if !counted {
			name = "uncounted"
		}
		t.Run(name, func(t *testing.T) {
			for _, mem := range []bool{false, true} {
				var st countingStore
				s := setup{memory: mem, opts: []idem.Option{idem.WithReplayCounts(counted)}}
				if mem {
					st = memory.New()
					s.memoryStore = st
				} else {
					s.store = func(pool *pgxpool.Pool) store.Store {
						st = postgres.New(pool)
						return st
					}
				}
				e := newEnv(t, s)
				req := &testv1.DoRequest{Value: "v"}
				for range 4 {
					if _, err := e.client.Do(withKey("ok"), req); err != nil {
						t.Fatal(err)
					}
				}
				_, err := e.client.Do(withKey("ok"), &testv1.DoRequest{Value: "other"})
				wantCode(t, err, codes.FailedPrecondition)
				e.svc.setHook(func(context.Context, string) error {
					return status.Error(codes.InvalidArgument, "amount must be positive")
				})
				for range 2 {
					_, err := e.client.Do(withKey("failed"), req)
					wantCode(t, err, codes.InvalidArgument)
				}
				if err := st.FlushReplays(t.Context()); err != nil {
					t.Fatal(err)
				}
				want := map[string]int64{"ok": 3, "failed": 1}
				for k, n := range want {
					if !counted {
						n = 0
					}
					ki, err := st.Key(t.Context(), store.Scope{Method: testv1.TestService_Do_FullMethodName, Key: k})
					if err != nil {
						t.Fatal(err)
					}
					if ki.Replays != n || (n > 0) == ki.LastReplay.IsZero() {
						t.Errorf("memory %v: key %q shows %d replays, the last at %v; want %d", mem, k, ki.Replays, ki.LastReplay, n)
					}
				}
			}
		})
	}
}

// staleListStore is store/memory whose Abandoned lists what it was given:
// a finisher's listing taken before a retry recorded the call.
type staleListStore struct {
	*memory.Store
	list []store.AbandonedCall
}

func (s *staleListStore) Abandoned(context.Context, time.Duration, int) ([]store.AbandonedCall, error) {
	return s.list, nil
}

// TestFinisherRunsAreNotCountedAsReplays: a finisher that takes on a call
// its caller's retry recorded meanwhile is answered from the record, and
// that answer is no replay to count: the key's replays count its callers'
// retries alone.
func TestFinisherRunsAreNotCountedAsReplays(t *testing.T) {
	st := &staleListStore{Store: memory.New()}
	e := serveEnv(t, setup{memory: true, opts: finishableOpts}, nil, st)
	finisher := newFinisherOn(t, e, st, &logBuffer{})
	e.svc.setHook(crashFirstRun(nil))
	_, err := e.client.Do(forTenant("acme", "order-1"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.Unknown)
	if st.list, err = st.Store.Abandoned(t.Context(), 0, 10); err != nil || len(st.list) != 1 {
		t.Fatalf("Abandoned = %v, %v; want the crashed call", st.list, err)
	}
	if _, err := e.client.Do(forTenant("acme", "order-1"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatalf("the retry that takes the call over: %v", err)
	}
	if n, err := finisher.Finish(t.Context()); err != nil || n != 1 {
		t.Fatalf("Finish = %d, %v; want the call found recorded", n, err)
	}
	k := store.Scope{Tenant: "acme", Method: testv1.TestService_Do_FullMethodName, Key: "order-1"}
	replays := func() int64 {
		t.Helper()
		ki, err := st.Key(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		return ki.Replays
	}
	if n := replays(); n != 0 {
		t.Errorf("the key counts %d replays after the finisher's run, want 0", n)
	}
	if _, err := e.client.Do(forTenant("acme", "order-1"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if n := replays(); n != 1 {
		t.Errorf("the key counts %d replays after the caller's retry, want 1", n)
	}
}
