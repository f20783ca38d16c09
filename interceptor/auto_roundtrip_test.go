package interceptor_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
)

// statements records the round trips to the server and the statements
// sent in them, in order.
type statements struct {
	mu    sync.Mutex
	trips int
	sql   []string
}

func (s *statements) reset() { s.mu.Lock(); s.trips, s.sql = 0, nil; s.mu.Unlock() }

func (s *statements) get() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trips, strings.Join(s.sql, "; ")
}

func (s *statements) add(trip bool, sql string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if trip {
		s.trips++
	}
	if sql != "" {
		s.sql = append(s.sql, strings.Join(strings.Fields(sql), " "))
	}
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.add(true, d.SQL)
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.add(true, "")
	return ctx
}

func (s *statements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.add(false, d.SQL)
}

func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestAutoRoundTrips pins idem.ModeAuto's cost to the other modes': a
// first attempt marked 1 makes the round trips of a first execution in
// idem.ModeOptimistic and sends its statements, and a retry marked 2
// those of a replay in idem.ModeAtomic.
func TestAutoRoundTrips(t *testing.T) {
	type cost struct {
		trips int
		sql   string
	}
	// measure runs one call of ctx on a server in mode whose pool has one
	// connection, after warming its statement cache with calls of keys of
	// their own, and returns the call's cost.
	measure := func(t *testing.T, mode idem.Mode, warm []context.Context, ctx context.Context) cost {
		t.Helper()
		tracer := &statements{}
		e := newEnv(t, setup{tracer: tracer, poolSize: 1, opts: []idem.Option{
			idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: mode}),
		}})
		idle := func() bool { return e.pool.Stat().IdleConns() == 1 }
		call := func(ctx context.Context) {
			t.Helper()
			if _, err := e.client.Do(ctx, &testv1.DoRequest{Value: "v"}); err != nil {
				t.Fatal(err)
			}
			if !idemtest.Eventually(30*time.Second, idle) {
				t.Fatal("the pool's connection never came back")
			}
		}
		for _, w := range warm {
			call(w)
		}
		tracer.reset()
		call(ctx)
		trips, sql := tracer.get()
		if n := e.countRows(t, `SELECT count(*) FROM effects WHERE key = 'k'`); n != 1 {
			t.Fatalf("%d effects of k, want 1", n)
		}
		return cost{trips, sql}
	}
	marked := func(key, attempt string) context.Context {
		return metadata.AppendToOutgoingContext(withKey(key), idem.AttemptHeader, attempt)
	}
	// Each server's warm-up runs every path the measured call may take.
	warm := []context.Context{marked("w1", "1"), marked("w1", "2"), withKey("w2"), withKey("w2")}

	optimisticFirst := measure(t, idem.ModeOptimistic, warm, withKey("k"))
	autoFirst := measure(t, idem.ModeAuto, warm, marked("k", "1"))
	if autoFirst != optimisticFirst {
		t.Errorf("a first attempt in mode auto: %+v, in mode optimistic %+v; want the same", autoFirst, optimisticFirst)
	}
	atomicReplay := measure(t, idem.ModeAtomic, append(warm, withKey("k")), withKey("k"))
	autoReplay := measure(t, idem.ModeAuto, append(warm, marked("k", "1")), marked("k", "2"))
	if autoReplay != atomicReplay {
		t.Errorf("a retry in mode auto: %+v, a replay in mode atomic %+v; want the same", autoReplay, atomicReplay)
	}
	// And not what the other mode pays.
	autoUnmarkedFirst := measure(t, idem.ModeAuto, warm, withKey("k"))
	if autoUnmarkedFirst == autoFirst {
		t.Errorf("an unmarked first execution in mode auto costs %+v, as a marked one does; want an atomic claim's cost", autoUnmarkedFirst)
	}
	t.Logf("first attempt %+v\nunmarked %+v\nreplay %+v", autoFirst, autoUnmarkedFirst, autoReplay)
}
