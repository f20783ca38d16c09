package interceptor_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fingerprint"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/idemtest/grpctest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/record"
	"github.com/idemkit/idem/store/postgres"
)

func TestFirstCallCommitsClaimEffectAndResponse(t *testing.T) {
	e := newEnv(t, setup{})
	var header metadata.MD
	codec := grpctest.NewRawCodec()
	resp, err := e.client.Do(withKey("k1"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header), grpc.ForceCodecV2(codec))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetValue() != "v" || resp.GetExecution() != 1 {
		t.Fatalf("response %v", resp)
	}
	if got := header.Get(idem.ReplayedHeader); len(got) != 0 {
		t.Fatalf("first response carries %s=%v", idem.ReplayedHeader, got)
	}
	if n := e.countRows(t, `SELECT count(*) FROM effects WHERE key = 'k1'`); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
	var (
		status string
		code   int32
		body   []byte
	)
	err = e.pool.QueryRow(context.Background(),
		`SELECT status, response_code, response FROM idempotency_keys
		 WHERE tenant = '' AND method = '/idem.test.v1.TestService/Do' AND key = 'k1'`).Scan(&status, &code, &body)
	if err != nil {
		t.Fatal(err)
	}
	// The response is recorded in an idem.record.v1.Record (internal/record):
	// its code, and the payload, the bytes the client got.
	rec, err := record.Decode(body)
	if err != nil || rec.Bare || int32(rec.Code) != code {
		t.Fatalf("recorded body %x: %+v, %v; want a record of code %d", body, rec, err, code)
	}
	payload := rec.Payload
	if !bytes.Equal(payload, codec.Last()) {
		t.Fatalf("recorded payload %x, the client got %x", payload, codec.Last())
	}
	recorded := new(testv1.DoResponse)
	if err := proto.Unmarshal(payload, recorded); err != nil {
		t.Fatal(err)
	}
	if status != "recorded" || code != 0 || !proto.Equal(recorded, resp) {
		t.Fatalf("recorded %s/%d %v, want completed/0 %v", status, code, recorded, resp)
	}
}

func TestReplayOfMapFreeResponseIsDecoded(t *testing.T) {
	// MaybeResponse has no maps: the replay is an ordinary message that
	// encodes to the recorded bytes.
	e := newEnv(t, setup{})
	codec := grpctest.NewRawCodec()
	first, err := e.client.Maybe(withKey("k"), &testv1.MaybeRequest{Value: "v"}, grpc.ForceCodecV2(codec))
	if err != nil {
		t.Fatal(err)
	}
	firstBytes := codec.Last()
	again, err := e.client.Maybe(withKey("k"), &testv1.MaybeRequest{Value: "v"}, grpc.ForceCodecV2(codec))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(codec.Last(), firstBytes) || !proto.Equal(again, first) {
		t.Fatalf("replay %x (%v), want %x (%v)", codec.Last(), again, firstBytes, first)
	}
	if n := e.effects(t); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}

func TestConcurrentDuplicatesExecuteOnce(t *testing.T) {
	concurrentDuplicatesExecuteOnce(t, newEnv(t, setup{poolSize: 16}))
}

// concurrentDuplicatesExecuteOnce sends 200 concurrent calls with one key
// to e, whose pool should have 16 connections.
func concurrentDuplicatesExecuteOnce(t *testing.T, e *env) {
	const callers = 200
	// Hold the first execution until every duplicate has reached the
	// server while it is in flight.
	e.svc.setHook(func(context.Context, string) error {
		if !idemtest.Eventually(30*time.Second, func() bool { return e.svc.arrived.Load() >= callers }) {
			return status.Error(codes.Internal, "the duplicates never arrived")
		}
		return nil
	})
	var (
		wg                  sync.WaitGroup
		mu                  sync.Mutex
		oks, aborted, other int
		executions          = map[int64]bool{}
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.client.Do(withKey("storm"), &testv1.DoRequest{Value: "v"})
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				oks++
				executions[resp.GetExecution()] = true
			case codes.Aborted:
				aborted++
				if retryDelay(err) == nil {
					t.Errorf("ABORTED without RetryInfo: %v", err)
				}
			default:
				other++
				t.Errorf("unexpected answer: %v", err)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d replies OK, %d ABORTED", oks, aborted)
	if oks == 0 || len(executions) != 1 || other != 0 {
		t.Fatalf("OK=%d ABORTED=%d other=%d, executions seen %v; want one execution shared by all OKs", oks, aborted, other, executions)
	}
	if n := e.svc.count(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if n := e.effects(t); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}

func TestDeterministicErrorIsRecordedAndReplayed(t *testing.T) {
	e := newEnv(t, setup{})
	e.svc.setHook(func(context.Context, string) error {
		st, _ := status.New(codes.InvalidArgument, "bad value").WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "value", Description: "bad"}},
		})
		return st.Err()
	})
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	first := wantCode(t, err, codes.InvalidArgument)
	// The handler's write is rolled back to the savepoint; the claim and
	// the error are kept.
	if n := e.effects(t); n != 0 {
		t.Fatalf("%d effect rows survived a recorded error, want 0", n)
	}
	if n := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'recorded' AND response_code = 3`); n != 1 {
		t.Fatalf("%d recorded INVALID_ARGUMENT rows, want 1", n)
	}

	e.svc.setHook(nil) // would succeed now, but the recorded error stands
	var header metadata.MD
	_, err = e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}, grpc.Header(&header))
	again := wantCode(t, err, codes.InvalidArgument)
	if !proto.Equal(again.Proto(), first.Proto()) {
		t.Fatalf("replayed %v, want %v", again.Proto(), first.Proto())
	}
	if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Fatalf("%s = %v, want [true]", idem.ReplayedHeader, got)
	}
	if n := e.svc.count(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestTransientErrorReleasesKey(t *testing.T) {
	for _, c := range []codes.Code{codes.Unavailable, codes.Internal, codes.Unauthenticated, codes.DeadlineExceeded} {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t, setup{})
			e.svc.setHook(func(context.Context, string) error { return status.Error(c, "blip") })
			_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
			wantCode(t, err, c)
			if n, k := e.effects(t), e.keys(t); n != 0 || k != 0 {
				t.Fatalf("after a transient error: %d effects, %d keys; want none", n, k)
			}
			e.svc.setHook(nil)
			resp, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetExecution() != 2 || e.effects(t) != 1 || e.keys(t) != 1 {
				t.Fatalf("retry: execution %d, %d effects, %d keys; want 2, 1, 1", resp.GetExecution(), e.effects(t), e.keys(t))
			}
		})
	}
}

func TestPanicReleasesKey(t *testing.T) {
	e := newEnv(t, setup{})
	e.svc.setHook(func(context.Context, string) error { panic("boom") })
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.Unknown) // from the recovery interceptor
	if n, k := e.effects(t), e.keys(t); n != 0 || k != 0 {
		t.Fatalf("after a panic: %d effects, %d keys; want none", n, k)
	}
	e.svc.setHook(nil)
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if n := e.effects(t); n != 1 {
		t.Fatalf("%d effect rows after the retry, want 1", n)
	}
}

func TestMethodPolicy(t *testing.T) {
	e := newEnv(t, setup{})
	// Maybe does not require a key: without one it runs unguarded.
	for range 2 {
		if _, err := e.client.Maybe(context.Background(), &testv1.MaybeRequest{Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	// Read has no side effects: a key is ignored and nothing is stored.
	for range 2 {
		if _, err := e.client.Read(withKey("k"), &testv1.ReadRequest{Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	if n, k := e.svc.count(), e.keys(t); n != 4 || k != 0 {
		t.Fatalf("%d executions and %d keys, want 4 and 0", n, k)
	}
}

func TestExpiredKeyRunsAgain(t *testing.T) {
	expiredKeyRunsAgain(t, newEnv(t, setup{}))
}

// TestOptimisticExpiredKeyRunsAgain: in optimistic mode the record finds
// the expired row, and the atomic claim that follows takes it over and
// runs the handler again.
func TestOptimisticExpiredKeyRunsAgain(t *testing.T) {
	expiredKeyRunsAgain(t, newEnv(t, setup{opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeOptimistic})}}))
}

// expiredKeyRunsAgain expires a key e's server recorded, and calls it
// again, once and then from many callers at once.
func expiredKeyRunsAgain(t *testing.T, e *env) {
	first, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	if err != nil {
		t.Fatal(err)
	}
	expire := `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`
	if _, err := e.pool.Exec(context.Background(), expire); err != nil {
		t.Fatal(err)
	}
	// An expired key counts as absent, even for another request body.
	second, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if second.GetExecution() == first.GetExecution() || e.effects(t) != 2 {
		t.Fatalf("after expiry: %v (first %v), %d effects; want a new execution", second, first, e.effects(t))
	}
	if n := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE expires_at > now() + interval '23 hours'`); n != 1 {
		t.Fatal("the taken-over key did not get a new expiry")
	}

	// Many concurrent retries of an expired key: one takes it over.
	if _, err := e.pool.Exec(context.Background(), expire); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "x"})
			if c := status.Code(err); c != codes.OK && c != codes.Aborted {
				t.Errorf("unexpected answer: %v", err)
			}
		}()
	}
	wg.Wait()
	if n := e.countRows(t, `SELECT count(*) FROM effects WHERE value = 'x'`); n != 1 {
		t.Fatalf("%d executions of the expired key, want 1", n)
	}
}

func TestDuplicateInFlightGetsAbortedWithRetryInfo(t *testing.T) {
	duplicateInFlightGetsAborted(t, setup{})
}

// duplicateInFlightGetsAborted calls a key while a call with it runs, on a
// server of s with a lock timeout of 100 ms.
func duplicateInFlightGetsAborted(t *testing.T, s setup) {
	s.storeOpts = []postgres.Option{postgres.WithLockTimeout(100 * time.Millisecond)}
	s.opts = []idem.Option{idem.WithRetryDelay(1500 * time.Millisecond)}
	e := newEnv(t, s)
	entered, released := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(released) })
	t.Cleanup(release) // a failed test must not leave the handler blocked
	e.svc.setHook(func(context.Context, string) error {
		close(entered)
		<-released
		return nil
	})
	firstDone := make(chan error, 1)
	go func() {
		_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
		firstDone <- err
	}()
	<-entered

	start := time.Now()
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	waited := time.Since(start)
	st := wantCode(t, err, codes.Aborted)
	if d := retryDelay(err); d == nil || *d != 1500*time.Millisecond {
		t.Fatalf("RetryInfo delay %v, want 1.5s", d)
	}
	if info := errorInfo(st); info == nil || info.GetReason() != idem.ReasonKeyInUse || info.GetDomain() != idem.Domain {
		t.Fatalf("ErrorInfo %v, want reason %s", info, idem.ReasonKeyInUse)
	}
	if waited > 2*time.Second {
		t.Fatalf("the duplicate waited %v with a 100ms lock timeout", waited)
	}

	release()
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if n, x := e.effects(t), e.svc.count(); n != 1 || x != 1 {
		t.Fatalf("%d effects, %d executions; want 1, 1", n, x)
	}
}

func TestHandlerTransaction(t *testing.T) {
	e := newEnv(t, setup{})
	var leaked pgx.Tx
	e.svc.setHook(func(ctx context.Context, value string) error {
		tx, ok := postgres.TxFromContext(ctx)
		if !ok {
			return status.Error(codes.Internal, "no transaction in context")
		}
		leaked = tx
		if err := tx.Commit(ctx); !errors.Is(err, postgres.ErrTxOwned) {
			return status.Errorf(codes.Internal, "Commit: %v, want ErrTxOwned", err)
		}
		if err := tx.Rollback(ctx); !errors.Is(err, postgres.ErrTxOwned) {
			return status.Errorf(codes.Internal, "Rollback: %v, want ErrTxOwned", err)
		}
		// A nested transaction that fails rolls back to its savepoint only.
		err := pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (key, value) VALUES ('nested', 'undone')`); err != nil {
				return err
			}
			return errors.New("undo")
		})
		if err == nil || err.Error() != "undo" {
			return status.Errorf(codes.Internal, "nested: %v", err)
		}
		return pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (key, value) VALUES ('nested', 'kept')`)
			return err
		})
	})
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	var values []string
	rows, _ := e.pool.Query(context.Background(), `SELECT value FROM effects ORDER BY id`)
	values, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(values, ",") != "v,kept" {
		t.Fatalf("effects %v, want [v kept]", values)
	}
	// The transaction is finished once the call returns; a handler that
	// kept it cannot touch a connection the pool has handed on.
	if _, err := leaked.Exec(context.Background(), `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec on a finished claim: %v, want ErrTxClosed", err)
	}
}

func TestCorruptRecordIsNotReplayed(t *testing.T) {
	e := newEnv(t, setup{})
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE idempotency_keys SET response = '\xff'`); err != nil {
		t.Fatal(err)
	}
	resp, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.Internal)
	if resp != nil {
		t.Fatalf("got a response from a corrupt record: %v", resp)
	}
	if n := e.svc.count(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestRoundTrips pins the cost of a first execution to that of the
// handler's own transaction without idem: BEGIN, the handler's statement
// and COMMIT, three round trips. With idem the claim travels with BEGIN and
// the record with COMMIT.
func TestRoundTrips(t *testing.T) {
	tracer := &roundTrips{}
	e := newEnv(t, setup{tracer: tracer, poolSize: 1})
	// Warm the connection's statement cache, which prepares statements on
	// first use.
	if _, err := e.client.Do(withKey("warm"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}

	tracer.reset()
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	withIdem, commitsWithIdem := tracer.get()

	tracer.reset()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, value) VALUES ($1, $2)`, "k", "v")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	without, commitsWithout := tracer.get()

	if withIdem > without || commitsWithIdem > commitsWithout {
		t.Fatalf("first execution: %d round trips and %d commits with idem, %d and %d without",
			withIdem, commitsWithIdem, without, commitsWithout)
	}

	tracer.reset()
	if _, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if replay, commits := tracer.get(); replay != 2 || commits != 0 {
		t.Fatalf("replay: %d round trips, %d commits; want 2 and 0", replay, commits)
	}
}

// roundTrips counts the statements and batches sent to the server (each one
// round trip once statements are cached) and the COMMITs among them.
type roundTrips struct {
	mu            sync.Mutex
	trips, commit int
}

func (r *roundTrips) reset() { r.mu.Lock(); r.trips, r.commit = 0, 0; r.mu.Unlock() }

func (r *roundTrips) get() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.trips, r.commit
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.trips++
	if strings.EqualFold(strings.TrimSpace(d.SQL), "commit") {
		r.commit++
	}
	r.mu.Unlock()
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	r.trips++
	r.mu.Unlock()
	return ctx
}

func (r *roundTrips) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.EqualFold(strings.TrimSpace(d.SQL), "commit") {
		r.mu.Lock()
		r.commit++
		r.mu.Unlock()
	}
}

func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

func retryDelay(err error) *time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			d := ri.GetRetryDelay().AsDuration()
			return &d
		}
	}
	return nil
}

// TestErrorAfterFailedStatementIsRecorded covers a handler whose statement
// failed (a unique violation aborts the transaction) and that reports it as
// a deterministic error: the error is still recorded and replayed.
func TestErrorAfterFailedStatementIsRecorded(t *testing.T) {
	e := newEnv(t, setup{})
	if _, err := e.pool.Exec(context.Background(), `CREATE UNIQUE INDEX ON effects (value)`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO effects (key, value) VALUES ('other', 'taken')`); err != nil {
		t.Fatal(err)
	}
	// The service's own insert of "taken" fails; the handler maps it.
	e.svc.setHook(nil)
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "taken"})
	if c := status.Code(err); c == codes.OK {
		t.Fatal("insert of a duplicate value succeeded")
	}
	// Unknown (a raw driver error) is transient: nothing is recorded.
	if n := e.keys(t); n != 0 {
		t.Fatalf("%d keys after a transient failure, want 0", n)
	}

	e.svc.setHook(func(ctx context.Context, _ string) error {
		tx, _ := postgres.TxFromContext(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO effects (key, value) VALUES ('x', 'taken')`); err == nil {
			return status.Error(codes.Internal, "duplicate insert succeeded")
		}
		return status.Error(codes.AlreadyExists, "value taken")
	})
	_, err = e.client.Do(withKey("k2"), &testv1.DoRequest{Value: "fresh"})
	wantCode(t, err, codes.AlreadyExists)
	if n := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE key = 'k2' AND response_code = 6`); n != 1 {
		t.Fatalf("%d recorded ALREADY_EXISTS rows, want 1", n)
	}
	if n := e.countRows(t, `SELECT count(*) FROM effects WHERE value = 'fresh'`); n != 0 {
		t.Fatalf("the handler's write survived a recorded error")
	}
	var header metadata.MD
	_, err = e.client.Do(withKey("k2"), &testv1.DoRequest{Value: "fresh"}, grpc.Header(&header))
	wantCode(t, err, codes.AlreadyExists)
	if len(header.Get(idem.ReplayedHeader)) != 1 {
		t.Fatal("second ALREADY_EXISTS was not a replay")
	}
}

// TestCommittedInProgressEntry covers a key another process committed as
// in progress (as a store with leases does): a duplicate is told to retry, a
// different request is rejected, and neither runs the handler.
func TestCommittedInProgressEntry(t *testing.T) {
	e := newEnv(t, setup{})
	req := &testv1.DoRequest{Value: "v"}
	fp, err := fingerprint.Sum(req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.pool.Exec(context.Background(),
		`INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, expires_at)
		 VALUES (`+pgtest.KeyIDSQL("''", "$1::text", "'k'")+`, '', $1, 'k', $2, now() + interval '1 hour')`, testv1.TestService_Do_FullMethodName, fp)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.client.Do(withKey("k"), req)
	st := wantCode(t, err, codes.Aborted)
	if info := errorInfo(st); info.GetReason() != idem.ReasonKeyInUse || retryDelay(err) == nil {
		t.Fatalf("in-progress duplicate: %v", st.Proto())
	}
	_, err = e.client.Do(withKey("k"), &testv1.DoRequest{Value: "other"})
	wantCode(t, err, codes.FailedPrecondition)
	if n := e.svc.count(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
}

// TestLostConnectionBeforeCommitReleasesKey kills the claim's database
// connection after the handler succeeded: the commit fails, the client is
// told to retry, nothing was stored, and the retry runs the handler again.
func TestLostConnectionBeforeCommitReleasesKey(t *testing.T) {
	e := newEnv(t, setup{})
	e.svc.setHook(func(ctx context.Context, _ string) error {
		tx, _ := postgres.TxFromContext(ctx)
		pid := tx.Conn().PgConn().PID()
		var killed bool
		if err := e.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed); err != nil || !killed {
			return status.Errorf(codes.Internal, "terminate backend %d: %v %v", pid, killed, err)
		}
		return nil
	})
	_, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	wantCode(t, err, codes.Unavailable)
	if n, k := e.effects(t), e.keys(t); n != 0 || k != 0 {
		t.Fatalf("after a failed commit: %d effects, %d keys; want none", n, k)
	}
	e.svc.setHook(nil)
	resp, err := e.client.Do(withKey("k"), &testv1.DoRequest{Value: "v"})
	if err != nil || resp.GetExecution() != 2 {
		t.Fatalf("retry: %v, %v; want the second execution", resp, err)
	}
	if n := e.effects(t); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}
