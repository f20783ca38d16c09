package interceptor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/record"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
)

// keptRequest returns the request recorded with k's outcome in st, nil
// when none was.
func keptRequest(t *testing.T, st store.Admin, k string) *testv1.DoRequest {
	t.Helper()
	ki, err := st.Key(t.Context(), store.Scope{Method: doMethod, Key: k})
	if err != nil {
		t.Fatal(err)
	}
	if ki.Outcome == nil {
		t.Fatalf("key %q has no outcome", k)
	}
	rec, err := record.Decode(ki.Outcome.Body)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Request == nil {
		return nil
	}
	req := &testv1.DoRequest{}
	if err := proto.Unmarshal(rec.Request, req); err != nil {
		t.Fatal(err)
	}
	return req
}

// TestKeepRequest: a method whose policy keeps requests records each
// request with its outcome, a response's or a recorded error's, the key
// it came with in its key field; one larger than the responses the engine
// records is not kept; replays answer as ever; and a method that does not
// keep them records none.
func TestKeepRequest(t *testing.T) {
	for _, mem := range []bool{false, true} {
		for _, keep := range []bool{true, false} {
			var st countingStore
			s := setup{memory: mem, opts: []idem.Option{
				idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeepRequest: keep}),
				idem.WithMaxStoredResponseBytes(200),
			}}
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
			for range 2 { // the first records, the second replays
				resp, err := e.client.Do(withKey("ok"), &testv1.DoRequest{Value: "pay", TraceId: "t-1"})
				if err != nil || resp.GetValue() != "pay" || resp.GetExecution() != 1 {
					t.Fatalf("Do: %v, %v; want the first execution's answer", resp, err)
				}
			}
			e.svc.setHook(func(context.Context, string) error { return status.Error(codes.InvalidArgument, "no") })
			_, err := e.client.Do(withKey("failed"), &testv1.DoRequest{Value: "bad"})
			wantCode(t, err, codes.InvalidArgument)
			_, err = e.client.Do(withKey("large"), &testv1.DoRequest{Value: strings.Repeat("x", 300)})
			wantCode(t, err, codes.InvalidArgument)

			got := keptRequest(t, st, "ok")
			switch want := (&testv1.DoRequest{Value: "pay", TraceId: "t-1", RequestId: "ok"}); {
			case !keep && got != nil:
				t.Errorf("memory %v: a method that keeps no requests recorded %v", mem, got)
			case keep && !proto.Equal(got, want):
				t.Errorf("memory %v: the kept request is %v, want %v", mem, got, want)
			}
			if got := keptRequest(t, st, "failed"); keep && got.GetValue() != "bad" {
				t.Errorf("memory %v: the request kept with a recorded error is %v, want value bad", mem, got)
			}
			if got := keptRequest(t, st, "large"); got != nil {
				t.Errorf("memory %v: a request over the cap was kept: %d bytes", mem, len(got.GetValue()))
			}
		}
	}
}
