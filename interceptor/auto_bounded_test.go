package interceptor_test

import (
	"context"
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
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// firstAttempt returns a context whose outgoing metadata carries key,
// marked as its first attempt.
func firstAttempt(key string) context.Context {
	return metadata.AppendToOutgoingContext(withKey(key), idem.AttemptHeader, "1")
}

// bouncedOrDirect runs f on a fresh database reached directly and through
// PgBouncer in transaction mode (a pool of two server connections); f gets
// the setup's database function and, once it ran, the direct connection
// string.
func bouncedOrDirect(t *testing.T, f func(t *testing.T, database func(*testing.T) string, direct *string)) {
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: 2})
	for _, bounced := range []bool{false, true} {
		name := "direct"
		if bounced {
			name = "pgbouncer"
		}
		t.Run(name, func(t *testing.T) {
			var direct string
			f(t, func(t *testing.T) string {
				direct = pgtest.NewDatabase(t)
				if !bounced {
					return direct
				}
				dsn, err := b.ConnString(direct)
				if err != nil {
					t.Fatal(err)
				}
				return dsn
			}, &direct)
		})
	}
}

// TestAutoFirstAttemptWaitsAreBounded: in idem.ModeAuto, a first attempt
// reads nothing before its handler, so it waits, if at all, at its record.
// Of two first attempts of one key the one that records first is the
// key's execution, and the other, still running, replays it. A call whose
// key row a session outside idem holds uncommitted is answered ABORTED
// IDEMPOTENCY_KEY_IN_USE with RetryInfo after about the lock timeout,
// with nothing of it kept; once the session rolls back, the key is
// executed once. Directly and through PgBouncer.
func TestAutoFirstAttemptWaitsAreBounded(t *testing.T) {
	const lockTimeout = 100 * time.Millisecond
	bouncedOrDirect(t, func(t *testing.T, database func(*testing.T) string, direct *string) {
		e := newEnv(t, setup{
			database:  database,
			storeOpts: []postgres.Option{postgres.WithLockTimeout(lockTimeout)},
			opts:      []idem.Option{autoDo, idem.WithRetryDelay(1500 * time.Millisecond)},
		})
		wantInUse := func(what string, err error, waited time.Duration) {
			t.Helper()
			st := wantCode(t, err, codes.Aborted)
			if info := errorInfo(st); info.GetReason() != idem.ReasonKeyInUse || info.GetDomain() != idem.Domain {
				t.Fatalf("%s: ErrorInfo %v, want reason %s", what, info, idem.ReasonKeyInUse)
			}
			if d := retryDelay(err); d == nil || *d != 1500*time.Millisecond {
				t.Fatalf("%s: RetryInfo delay %v, want 1.5s", what, d)
			}
			if waited > 25*lockTimeout {
				t.Fatalf("%s: answered after %v with a lock timeout of %v", what, waited, lockTimeout)
			}
		}

		// A duplicate sent while the first call runs, before its record:
		// nothing holds the key yet, so the duplicate records it, and the
		// first call's record finds it taken, rolls back and replays it.
		entered, released := make(chan struct{}), make(chan struct{})
		release := sync.OnceFunc(func() { close(released) })
		t.Cleanup(release) // a failed test must not leave the handler blocked
		var once sync.Once
		e.svc.setHook(func(context.Context, string) error {
			first := false
			once.Do(func() { first = true; close(entered) })
			if first {
				<-released
			}
			return nil
		})
		type answer struct {
			resp   *testv1.DoResponse
			header metadata.MD
			err    error
		}
		firstDone := make(chan answer, 1)
		go func() {
			var a answer
			a.resp, a.err = e.client.Do(firstAttempt("k"), &testv1.DoRequest{Value: "v"}, grpc.Header(&a.header))
			firstDone <- a
		}()
		<-entered
		dup, err := e.client.Do(firstAttempt("k"), &testv1.DoRequest{Value: "v"})
		if err != nil {
			t.Fatalf("the duplicate: %v, want its execution", err)
		}
		release()
		first := <-firstDone
		if first.err != nil || !proto.Equal(first.resp, dup) || len(first.header.Get(idem.ReplayedHeader)) != 1 {
			t.Fatalf("the first call: %v, %v (%v); want the duplicate's answer %v, replayed", first.resp, first.err, first.header, dup)
		}
		if n, x := e.effects(t), e.svc.count(); n != 1 || x != 2 {
			t.Fatalf("after the duplicate: %d effects, %d executions; want 1, 2 (the duplicate's, and the first's rolled back)", n, x)
		}

		rollback := holdKeyRow(t, *direct, doMethod, "held")
		hctx, hcancel := context.WithTimeout(firstAttempt("held"), 10*time.Second)
		defer hcancel()
		start := time.Now()
		_, err = e.client.Do(hctx, &testv1.DoRequest{Value: "v"})
		wantInUse("the call behind the held row", err, time.Since(start))
		if n := e.countRows(t, `SELECT count(*) FROM effects WHERE key = 'held'`); n != 0 {
			t.Fatalf("with the other session open: %d effects of the held key, want 0", n)
		}
		rollback()
		if _, err := e.client.Do(firstAttempt("held"), &testv1.DoRequest{Value: "v"}); err != nil {
			t.Fatalf("retry once the other session rolled back: %v", err)
		}
		if n := e.countRows(t, `SELECT count(*) FROM effects WHERE key = 'held'`); n != 1 {
			t.Fatalf("%d effects of the held key, want 1", n)
		}
	})
}

// TestAutoPgBouncerStorm sends 20 concurrent first attempts of one key
// through PgBouncer in transaction mode, every handler running at once,
// with a pool of 16 connections behind PgBouncer's two: every caller gets
// the one execution's answer or ABORTED with RetryInfo, and one effect
// stands.
func TestAutoPgBouncerStorm(t *testing.T) {
	const callers = 20
	b := pgtest.NewPgBouncer(t, pgtest.PgBouncerOptions{PoolSize: 2})
	e := newEnv(t, setup{poolSize: 16, opts: []idem.Option{autoDo}, database: func(t *testing.T) string { return b.NewDatabase(t) }})
	e.svc.setHook(func(context.Context, string) error {
		if !idemtest.Eventually(30*time.Second, func() bool { return e.svc.arrived.Load() >= callers }) {
			return status.Error(codes.Internal, "the duplicates never arrived")
		}
		return nil
	})
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		executions = map[int64]int{}
		aborted    int
	)
	for range callers {
		wg.Go(func() {
			resp, err := e.client.Do(firstAttempt("storm"), &testv1.DoRequest{Value: "v"})
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				executions[resp.GetExecution()]++
			case codes.Aborted:
				aborted++
				if retryDelay(err) == nil {
					t.Errorf("ABORTED without RetryInfo: %v", err)
				}
			default:
				t.Errorf("unexpected answer: %v", err)
			}
		})
	}
	wg.Wait()
	t.Logf("answers by execution %v, %d ABORTED", executions, aborted)
	if len(executions) != 1 {
		t.Fatalf("answers came from executions %v, want one", executions)
	}
	if n, k := e.effects(t), e.keys(t); n != 1 || k != 1 {
		t.Fatalf("%d effects, %d keys; want 1, 1", n, k)
	}
}
