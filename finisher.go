package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idem/internal/bridge"
	"github.com/idemkit/idem/store"
)

// Finisher finishes leased calls whose callers are gone: a call of a method
// that opted in ((idem.v1.method).finish, or [MethodPolicy].Finish) whose lease ran
// out and which nobody took over within a grace period is taken over as a
// retry would (a new fencing token, the same request, kept with the
// claim), and its handler is run through the [Engine], after its recorded
// steps, to the end. Its outcome is recorded, so the caller's retry, if it
// ever comes, replays it.
//
// Each transport registers the handlers it serves with it:
// interceptor.FinisherRegistrar takes a gRPC service as a grpc.Server
// does, idemconnect.FinishHandler a Connect handler. Run one Finisher per
// replica, as the sweeper: finishers skip each other's calls, and the
// fencing token lets only one of them, or a retry, finish a call. Each
// failed attempt waits twice as long as the one before (the grace, then
// twice it, and so on); after the last attempt the call is recorded as
// failed, FAILED_PRECONDITION with ErrorInfo reason [ReasonNotFinished],
// which its retry then replays. A call whose kept request cannot be read
// (a damaged row, or bytes that are not a request of its method) is
// recorded so at once, logged at ERROR and reported as [ResultUnreadable];
// it never holds up the others. A panic anywhere in one call's attempt is
// logged and leaves the call for a later pass.
// [Finisher.FinishKey] finishes one given call now, through the same
// attempt, for an operator (the admin service's FinishKey) who will not
// wait for the grace.
//
// The handler runs with the tenant and the request metadata
// (finish_headers, [MethodPolicy].FinishHeaders) kept with the call, and the call's key. Idem's
// metrics, logs and report hook see the run, with [Report].Finishing
// set.
//
// A Finisher is safe for concurrent use.
type Finisher struct {
	engine *Engine
	store  store.Finishing
	opts   finisherOptions

	mu       sync.Mutex
	handlers map[string]bridge.FinishFunc // by full method
}

// NewFinisher returns a Finisher of the calls e serves, configured with
// opts. e's store must keep what finishing needs (store.Finishing); both of
// idem's stores do. An option given a value it does not take (a negative
// grace, an interval, batch size, attempt count or attempt timeout that is
// not positive) is an error naming it.
func NewFinisher(e *Engine, opts ...FinisherOption) (*Finisher, error) {
	o := finisherOptions{
		interval:       defaultFinishInterval,
		grace:          defaultFinishGrace,
		batchSize:      defaultFinishBatchSize,
		maxAttempts:    defaultFinishMaxAttempts,
		attemptTimeout: defaultFinishAttemptTimeout,
	}
	for _, opt := range opts {
		opt.applyFinisher(&o)
	}
	if err := errors.Join(o.errs...); err != nil {
		return nil, err
	}
	cs, ok := e.store.(store.Finishing)
	if !ok {
		return nil, fmt.Errorf("idem: the store (%T) does not keep calls to finish", e.store)
	}
	return &Finisher{engine: e, store: cs, opts: o, handlers: map[string]bridge.FinishFunc{}}, nil
}

// register registers run as the way to run again the calls of fullMethod
// ("/pkg.Service/Method"): transport.RegisterFinish. A method registered
// twice keeps the later run.
func (f *Finisher) register(fullMethod string, run bridge.FinishFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlers[fullMethod] = run
}

// finishCtxKey is the key of the finishRun in the context of a call a
// Finisher runs: it crosses the transport's handler chain (its
// interceptors) to reach the Engine, as a retry's metadata would.
type finishCtxKey struct{}

// finishRun is one Finisher's run of a call: the tenant kept with it, and
// the result the Engine ended it with.
type finishRun struct {
	tenant string
	result Result
}

// Finish runs one pass: it takes on up to the batch size of abandoned
// calls, one after the other, and returns how many it finished (recorded an
// outcome for, a recorded failure included). A call another finisher or a
// retry holds is skipped; a call that fails transiently is left for a later
// pass. The error reports a failure to list the calls (within the
// interval, [WithInterval]); the calls the store listed all the same (those of the
// shards that answered, for a store of several databases) are taken on
// first.
func (f *Finisher) Finish(ctx context.Context) (int, error) {
	list, err := f.list(ctx)
	done := 0
	for _, a := range list {
		if ctx.Err() != nil {
			return done, ctx.Err()
		}
		if f.attempt(ctx, a) == nil {
			done++
		}
	}
	return done, err
}

// list returns the abandoned calls to take on, within the interval: a
// pass never waits on the list for longer than the next pass would.
func (f *Finisher) list(ctx context.Context) (list []store.AbandonedCall, err error) {
	ctx, cancel := context.WithTimeout(ctx, f.opts.interval)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			list, err = nil, fmt.Errorf("idem: listing abandoned calls panicked: %v", p)
		}
	}()
	return f.store.Abandoned(ctx, f.opts.grace, f.opts.batchSize)
}

// Run finishes at once and then again every interval, until ctx ends. A
// failure to list the calls is logged and tried again at the next pass. It
// returns ctx's error.
func (f *Finisher) Run(ctx context.Context) error {
	for {
		if _, err := f.Finish(ctx); err != nil && ctx.Err() == nil {
			f.engine.log(ctx, slog.LevelError, "idem: listing abandoned calls failed", store.Scope{}, err)
		}
		t := time.NewTimer(f.opts.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// FinishKey finishes the abandoned call of k now, without waiting for the
// grace that [Finisher.Finish] leaves its retry: it takes the call over as
// a retry would and runs it through its registered handler, as a pass
// does, within the attempt timeout; nil means an outcome is now recorded
// for it (a recorded error included, and the failure recorded when the
// call is past its last attempt), which [store.Admin.Key] reads. The store
// must implement [store.Admin] to read k; both of idem's stores do.
//
// It fails with [store.ErrNotFound] when the store holds no live entry of
// k, [store.ErrNotInProgress] when its outcome is recorded already, a
// [*store.LeaseLiveError] when its lease is live (its caller, or a retry,
// may still record it), and [ErrNotFinishable] when nothing was kept to
// run it again. Otherwise its error is the attempt's, the call left for a
// later pass: an [*Error] with code ABORTED when a retry or another
// finisher took the call over first, FAILED_PRECONDITION when its method
// is not registered with f, or the handler's error, as the engine
// returned it, when it failed transiently.
func (f *Finisher) FinishKey(ctx context.Context, k store.Scope) error {
	ad, ok := f.engine.store.(store.Admin)
	if !ok {
		return fmt.Errorf("idem: the store (%T) cannot read one key: it does not implement store.Admin", f.engine.store)
	}
	ki, err := ad.Key(ctx, k)
	if err != nil {
		return err
	}
	switch ki.State {
	case store.Recorded:
		return store.ErrNotInProgress
	case store.Expired:
		return store.ErrNotFound
	case store.InProgress:
		return &store.LeaseLiveError{Until: ki.LeaseUntil}
	}
	if ki.Call == nil {
		return ErrNotFinishable
	}
	return f.attempt(ctx, store.AbandonedCall{Scope: ki.Scope, Fingerprint: ki.Fingerprint, Call: *ki.Call, Takeovers: ki.Takeovers})
}

// attempt tries to finish a's call once, within the attempt timeout; nil
// means it did. A panic is logged and counts as not finished.
func (f *Finisher) attempt(ctx context.Context, a store.AbandonedCall) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = NewError(code.Code_INTERNAL, fmt.Sprintf("idem: finishing the call panicked: %v", p))
			f.engine.log(ctx, slog.LevelError, "idem: finishing an abandoned call panicked; it is tried again later", a.Scope, fmt.Errorf("%v", p))
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, f.opts.attemptTimeout)
	defer cancel()
	return f.finish(ctx, a)
}

// finish runs a's call through its registered handler; nil means an
// outcome is now recorded for it, an error says why not.
func (f *Finisher) finish(ctx context.Context, a store.AbandonedCall) error {
	if a.Unreadable != nil {
		return f.setAside(ctx, a, a.Unreadable)
	}
	if a.Takeovers >= f.opts.maxAttempts {
		return f.giveUp(ctx, a)
	}
	method := a.Call.Method
	f.mu.Lock()
	run, ok := f.handlers[method]
	f.mu.Unlock()
	if !ok {
		f.engine.log(ctx, slog.LevelWarn, "idem: an abandoned call's method is not registered with the finisher: "+method, a.Scope, nil)
		return NewError(code.Code_FAILED_PRECONDITION, "idem: the call's method is not registered with the finisher: "+method)
	}
	req, err := requestOf(method, a.Call.Request)
	if err != nil {
		return f.setAside(ctx, a, fmt.Errorf("idem: the kept request is not a request of %s: %w", method, err))
	}
	header := make(map[string][]string, len(a.Call.Metadata)+1)
	for k, v := range a.Call.Metadata {
		header[k] = append([]string(nil), v...)
	}
	header[KeyHeader] = []string{a.Scope.Key}
	r := &finishRun{tenant: a.Scope.Tenant}
	err = f.call(context.WithValue(ctx, finishCtxKey{}, r), run, req, header)
	switch r.result {
	case ResultExecuted, ResultReplayed, ResultNotCached, ResultRebuilt, ResultRerun:
		return nil // recorded, by this run or before it
	case ResultInUse, ResultLeaseLost:
		return err // a retry or another finisher holds it, or took it over
	}
	if err == nil {
		// The handler answered without the Engine recording anything.
		return NewError(code.Code_INTERNAL, "idem: the finisher's run of "+method+" recorded no outcome")
	}
	f.engine.log(ctx, slog.LevelWarn, "idem: finishing an abandoned call failed; it is tried again later", a.Scope, err)
	return err
}

// call runs run, turning a panic of the handler into an error.
func (f *Finisher) call(ctx context.Context, run bridge.FinishFunc, req proto.Message, header map[string][]string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = NewError(code.Code_INTERNAL, fmt.Sprintf("idem: the handler panicked: %v", p))
		}
	}()
	return run(ctx, f.engine, req, header)
}

// requestOf decodes the kept request of a call of fullMethod into a new
// message of the method's input type, from the protobuf registry.
func requestOf(fullMethod string, b []byte) (proto.Message, error) {
	md, err := findMethod(protoregistry.GlobalFiles, fullMethod)
	if err != nil {
		return nil, err
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if err != nil {
		return nil, err
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, err
	}
	return m, nil
}

// giveUp records a's call as failed for good, taking it over first.
func (f *Finisher) giveUp(ctx context.Context, a store.AbandonedCall) error {
	msg := fmt.Sprintf("idem: the call was abandoned by its caller, and %d attempts to finish it failed; some of its steps may be done", a.Takeovers)
	if err := f.recordFailed(ctx, a, msg); err != nil {
		return err
	}
	f.engine.log(ctx, slog.LevelError, "idem: gave up finishing an abandoned call; it is recorded as failed", a.Scope, nil)
	f.report(ctx, a, ResultNotFinished)
	return nil
}

// setAside records a's call, which cannot be run again because what was
// kept of it cannot be read (why says how), as failed for good, so that it
// leaves the list of abandoned calls and its retries get an answer. It is
// logged at ERROR with the call's scope, never with what was kept.
func (f *Finisher) setAside(ctx context.Context, a store.AbandonedCall, why error) error {
	f.engine.log(ctx, slog.LevelError, "idem: an abandoned call cannot be finished: what was kept of it cannot be read; it is recorded as failed", a.Scope, why)
	if err := f.recordFailed(ctx, a, "idem: the call was abandoned by its caller, and what was kept to finish it cannot be read; some of its steps may be done"); err != nil {
		return err
	}
	f.report(ctx, a, ResultUnreadable)
	return nil
}

// recordFailed takes a's call over, as a retry would, and records it as
// failed, FAILED_PRECONDITION with ErrorInfo reason ReasonNotFinished and
// message msg. The takeover's fencing token keeps the record from
// replacing the outcome of a retry or another finisher that took the call
// meanwhile. It returns nil when the outcome was recorded.
func (f *Finisher) recordFailed(ctx context.Context, a store.AbandonedCall, msg string) error {
	lc, err := f.engine.store.ClaimLeased(ctx, a.Scope, store.LeaseRequest{Fingerprint: a.Fingerprint, Lease: time.Minute})
	if err != nil {
		f.engine.log(ctx, slog.LevelWarn, "idem: taking an abandoned call over to record it as failed failed; it is tried again later", a.Scope, err)
		return err
	}
	if lc.Lease == nil {
		// A retry or another finisher holds it, or recorded it.
		return NewError(code.Code_ABORTED, "idem: a retry or another finisher took the call over first")
	}
	st := NewError(code.Code_FAILED_PRECONDITION, msg,
		&errdetails.ErrorInfo{Reason: ReasonNotFinished, Domain: Domain}).status
	body, _, err := encodeOutcome(code.Code_FAILED_PRECONDITION, st, nil, nil, nil)
	if err == nil {
		err = lc.Lease.Record(ctx, store.Outcome{Code: code.Code_FAILED_PRECONDITION, Body: body})
	}
	if err != nil {
		_ = lc.Lease.Release(ctx)
		f.engine.log(ctx, slog.LevelWarn, "idem: recording an abandoned call as failed failed; it is tried again later", a.Scope, err)
		return err
	}
	return nil
}

// report reports the outcome r of a's call, which the Finisher recorded
// without running it.
func (f *Finisher) report(ctx context.Context, a store.AbandonedCall, r Result) {
	method := a.Call.Method
	if method == "" {
		method = a.Scope.Method
	}
	f.engine.report(ctx, &callState{method: method, mode: ModeLeased, result: r, started: time.Now(), key: a.Scope, finishing: true})
}
