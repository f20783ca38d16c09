package interceptor

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/store"
)

// ReasonNotCompleted is the ErrorInfo reason recorded for a leased call that
// a [Completer] gave up on: it was abandoned by its caller and failed every
// attempt to finish it. Its steps may be partly done.
const ReasonNotCompleted = "IDEMPOTENCY_NOT_COMPLETED"

// Defaults of the Completer's options.
const (
	DefaultCompleteInterval    = 10 * time.Second
	DefaultCompleteGrace       = 30 * time.Second
	DefaultCompleteBatchSize   = 100
	DefaultCompleteMaxAttempts = 8
)

// Completer finishes leased calls whose callers are gone: a call of a method
// that opted in to completion ((idem.v1.method).complete, or
// [WithCompletion]) whose lease ran out and which nobody took over within a
// grace period is taken over as a retry would (a new fencing token, the
// same request, kept with the claim), and its handler is run through the
// [Engine], from its last step, to the end. Its outcome is recorded, so the
// caller's retry, if it ever comes, replays it.
//
// Register the services whose calls it may complete as on a grpc.Server:
// a Completer is a grpc.ServiceRegistrar. Run one per replica, as the
// sweeper: completers skip each other's calls, and the fencing token lets
// only one of them, or a retry, finish a call. Each failed attempt waits
// twice as long as the one before (the grace, then twice it, and so on);
// after the last attempt the call is recorded as failed, FAILED_PRECONDITION
// with ErrorInfo reason [ReasonNotCompleted], which its retry then
// replays.
//
// The handler runs with the tenant and the allowlisted metadata
// ([WithCompletionMetadata]) kept with the call, and with the call's key in
// the incoming metadata; no other interceptor runs around it. A Completer
// is safe for concurrent use.
type Completer struct {
	engine   *Engine
	store    store.Completions
	opts     completerOptions
	mu       sync.Mutex
	handlers map[string]completeHandler // by full method
}

// completeHandler is a registered method of a service.
type completeHandler struct {
	srv  any
	desc grpc.MethodDesc
}

type completerOptions struct {
	interval, grace time.Duration
	batch, attempts int
}

// CompleterOption configures a [Completer].
type CompleterOption func(*completerOptions)

// WithCompleteInterval sets how long [Completer.Run] waits between passes.
// Default: [DefaultCompleteInterval] (10 s); non-positive selects it.
func WithCompleteInterval(d time.Duration) CompleterOption {
	return func(o *completerOptions) {
		if d > 0 {
			o.interval = d
		}
	}
}

// WithCompleteGrace sets how long after a lease ran out a call counts as
// abandoned: long enough for its caller's own retry to come first. Each
// attempt that fails doubles it for the call. Default:
// [DefaultCompleteGrace] (30 s); negative selects it.
func WithCompleteGrace(d time.Duration) CompleterOption {
	return func(o *completerOptions) {
		if d >= 0 {
			o.grace = d
		}
	}
}

// WithCompleteBatchSize sets how many calls a pass takes on at most.
// Default: [DefaultCompleteBatchSize] (100); non-positive selects it.
func WithCompleteBatchSize(n int) CompleterOption {
	return func(o *completerOptions) {
		if n > 0 {
			o.batch = n
		}
	}
}

// WithCompleteMaxAttempts sets after how many takeovers of a call (by
// completers or retries) a completer gives up on it and records it as
// failed. Default: [DefaultCompleteMaxAttempts] (8); non-positive selects
// it.
func WithCompleteMaxAttempts(n int) CompleterOption {
	return func(o *completerOptions) {
		if n > 0 {
			o.attempts = n
		}
	}
}

// NewCompleter returns a Completer of the calls e serves. e's store must
// keep completions (store.Completions: idem's PostgreSQL and memory stores
// do); NewCompleter fails otherwise.
func NewCompleter(e *Engine, opts ...CompleterOption) (*Completer, error) {
	cs, ok := e.store.(store.Completions)
	if !ok {
		return nil, fmt.Errorf("idem: the store (%T) does not keep completions", e.store)
	}
	o := completerOptions{
		interval: DefaultCompleteInterval,
		grace:    DefaultCompleteGrace,
		batch:    DefaultCompleteBatchSize,
		attempts: DefaultCompleteMaxAttempts,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return &Completer{engine: e, store: cs, opts: o, handlers: map[string]completeHandler{}}, nil
}

var _ grpc.ServiceRegistrar = (*Completer)(nil)

// RegisterService registers the unary methods of a service implementation,
// as grpc.Server does, so that the generated RegisterXxxServer functions
// take a Completer.
func (c *Completer) RegisterService(desc *grpc.ServiceDesc, impl any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, md := range desc.Methods {
		c.handlers["/"+desc.ServiceName+"/"+md.MethodName] = completeHandler{srv: impl, desc: md}
	}
}

// completionCtxKey marks the context of a call a Completer runs.
type completionCtxKey struct{}

// completionRun is what a Completer tells the Engine of a call it runs.
type completionRun struct {
	tenant string
}

// Complete runs one pass: it takes on up to the batch size of abandoned
// calls, one after the other, and returns how many it finished (recorded an
// outcome for, a recorded failure included). A call another completer or a
// retry holds is skipped; a call that fails transiently is left for a later
// pass. The error reports a failure to list the calls; the calls the store
// listed all the same (those of the shards that answered, for a store of
// several databases) are taken on first.
func (c *Completer) Complete(ctx context.Context) (int, error) {
	list, err := c.store.Abandoned(ctx, c.opts.grace, c.opts.batch)
	done := 0
	for _, a := range list {
		if ctx.Err() != nil {
			return done, ctx.Err()
		}
		if c.complete(ctx, a) {
			done++
		}
	}
	return done, err
}

// Run completes at once and then again every interval, until ctx ends. A
// failed pass is logged and retried at the next interval. It returns
// ctx.Err() when ctx is done.
func (c *Completer) Run(ctx context.Context) error {
	for {
		if _, err := c.Complete(ctx); err != nil && ctx.Err() == nil {
			c.engine.log(ctx, slog.LevelError, "idem: listing abandoned calls failed", store.Key{}, err)
		}
		t := time.NewTimer(c.opts.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// complete takes a over and runs it; it reports whether the call's outcome
// was recorded.
func (c *Completer) complete(ctx context.Context, a store.Abandoned) bool {
	if a.Takeovers >= c.opts.attempts {
		return c.giveUp(ctx, a)
	}
	c.mu.Lock()
	h, ok := c.handlers[a.Completion.Method]
	c.mu.Unlock()
	if !ok {
		c.engine.log(ctx, slog.LevelWarn, "idem: an abandoned call's method is not registered with the completer: "+a.Completion.Method, a.Key, nil)
		return false
	}
	md := metadata.MD{}
	for k, v := range a.Completion.Metadata {
		md[k] = append([]string(nil), v...)
	}
	md.Set(KeyHeader, a.Key.Key)
	cctx := context.WithValue(metadata.NewIncomingContext(ctx, md), completionCtxKey{}, completionRun{tenant: a.Key.Tenant})
	var outcome Result
	intercept := c.engine.unary()
	hook := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return intercept(context.WithValue(ctx, outcomeCtxKey{}, &outcome), req, info, handler)
	}
	dec := func(req any) error { return proto.Unmarshal(a.Completion.Request, req.(proto.Message)) }
	_, err := c.run(cctx, h, dec, hook)
	switch outcome {
	case ResultExecuted, ResultReplayed:
		return true
	case ResultInUse, ResultLeaseLost:
		return false // a retry or another completer holds it, or took it over
	}
	if err != nil {
		c.engine.log(ctx, slog.LevelWarn, "idem: completing an abandoned call failed; it is tried again later", a.Key, err)
	}
	return false
}

// run calls the handler of h as grpc.Server would, with intercept around
// it, and turns a panic into an error.
func (c *Completer) run(ctx context.Context, h completeHandler, dec func(any) error, intercept grpc.UnaryServerInterceptor) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "idem: the handler panicked: %v", p)
		}
	}()
	return h.desc.Handler(h.srv, ctx, dec, intercept)
}

// giveUp records a's call as failed for good, taking it over first.
func (c *Completer) giveUp(ctx context.Context, a store.Abandoned) bool {
	lc, err := c.engine.store.Lease(ctx, a.Key, store.Request{Fingerprint: a.Fingerprint}, time.Minute)
	if err != nil || lc.Lease == nil {
		return false
	}
	st, _ := status.New(codes.FailedPrecondition,
		fmt.Sprintf("idem: the call was abandoned by its caller, and %d attempts to complete it failed; some of its steps may be done", a.Takeovers)).
		WithDetails(&errdetails.ErrorInfo{Reason: ReasonNotCompleted, Domain: Domain})
	body, _, err := encodeOutcome(st.Code(), st.Proto(), nil, nil)
	if err == nil {
		err = lc.Lease.Complete(ctx, store.Outcome{Code: st.Code(), Body: body})
	}
	if err != nil {
		_ = lc.Lease.Release(ctx)
		return false
	}
	c.engine.log(ctx, slog.LevelError, "idem: gave up completing an abandoned call; it is recorded as failed", a.Key, nil)
	c.engine.report(ctx, &callState{method: a.Completion.Method, mode: ModeLeased, result: ResultNotCompleted, started: time.Now(), key: a.Key, completion: true})
	return true
}

// outcomeCtxKey carries where the Engine writes a call's result, for the
// Completer.
type outcomeCtxKey struct{}
