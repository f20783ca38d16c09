package interceptor

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
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

// ResultUnreadable: a Completer could not read what was kept of an
// abandoned call (its row is damaged, or its request is not a request of
// its method), so the call cannot be run again; it was recorded as failed
// (FAILED_PRECONDITION, reason IDEMPOTENCY_NOT_COMPLETED) and the problem
// logged at ERROR.
const ResultUnreadable Result = "unreadable"

// Defaults of the Completer's options.
const (
	DefaultCompleteInterval       = 10 * time.Second
	DefaultCompleteGrace          = 30 * time.Second
	DefaultCompleteBatchSize      = 100
	DefaultCompleteMaxAttempts    = 8
	DefaultCompleteListTimeout    = 10 * time.Second
	DefaultCompleteAttemptTimeout = time.Minute
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
// replays. A call whose kept request cannot be read (a damaged row, or
// bytes that are not a request of its method) is recorded so at once,
// logged at ERROR and reported as [ResultUnreadable]; it never holds up the
// others.
//
// Each pass waits for the store's list at most [WithCompleteListTimeout]
// (per database, on a sharded store: one that does not answer does not
// hold up the others' calls), and each attempt to finish a call lasts at
// most [WithCompleteAttemptTimeout]. A panic anywhere in one call's attempt
// is logged and leaves the call for a later pass.
//
// The handler runs with the tenant and the allowlisted metadata
// ([WithCompletionMetadata]) kept with the call, and with the call's key in
// the incoming metadata. The interceptors given to
// [WithCompleteInterceptors] run around idem's, in the order given, as
// they do on the server; without them no other interceptor runs. The
// context carries a grpc.ServerTransportStream: grpc.Method reports the
// method, and grpc.SetHeader, grpc.SendHeader and grpc.SetTrailer work; the
// metadata set is recorded with the outcome and replayed to a retry, as on
// a call the server receives. What still differs: there is no peer
// (peer.FromContext reports none), no credentials and no transport, so
// nothing is sent; the incoming metadata is only what was kept; the
// deadline is the attempt's bound, not a client's; and the server's stats
// handlers (otelgrpc's spans, say) do not see the run. Idem's metrics,
// logs and outcome hook do, with [Outcome].Completion set.
//
// A Completer is safe for concurrent use.
type Completer struct {
	engine    *Engine
	store     store.Completions
	opts      completerOptions
	intercept grpc.UnaryServerInterceptor // the options' interceptors, then the engine's
	mu        sync.Mutex
	handlers  map[string]completeHandler // by full method
}

// completeHandler is a registered method of a service.
type completeHandler struct {
	srv  any
	desc grpc.MethodDesc
}

type completerOptions struct {
	interval, grace             time.Duration
	batch, attempts             int
	listTimeout, attemptTimeout time.Duration
	interceptors                []grpc.UnaryServerInterceptor
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

// WithCompleteListTimeout bounds how long a pass waits for the store's
// list of abandoned calls. A store of several databases (postgres's
// NewSharded) asks them all at once, so this bounds each of them: the
// calls of those that answered in time are taken on, and the pass's error
// names the others, whose calls wait for a later pass. Default:
// [DefaultCompleteListTimeout] (10 s); non-positive selects it.
func WithCompleteListTimeout(d time.Duration) CompleterOption {
	return func(o *completerOptions) {
		if d > 0 {
			o.listTimeout = d
		}
	}
}

// WithCompleteAttemptTimeout bounds each attempt to finish one call:
// taking it over, running its handler, whose context ends then, and
// recording its outcome (which, once the handler has returned, gets a few
// seconds more, as on the server). An attempt that runs out fails as a
// transient error does: the call is tried again later, and counts towards
// [WithCompleteMaxAttempts]. Set it well above the handler's latency.
// Default: [DefaultCompleteAttemptTimeout] (1 min); non-positive selects
// it.
func WithCompleteAttemptTimeout(d time.Duration) CompleterOption {
	return func(o *completerOptions) {
		if d > 0 {
			o.attemptTimeout = d
		}
	}
}

// WithCompleteInterceptors sets unary server interceptors to run around
// each call the Completer runs, the first outermost, as
// grpc.ChainUnaryInterceptor runs them: pass those the server chains
// before idem's interceptor (the ones that put an identity or a logger in
// the context, or count calls), in the same order. Idem's own interceptor
// always runs last, just around the handler: do not pass it, nor one that
// needs what a completer's run lacks (a peer, credentials, metadata that
// was not kept; see [Completer]). An interceptor that fails the call keeps
// it from finishing; it is tried again at the next pass. Default: none.
func WithCompleteInterceptors(interceptors ...grpc.UnaryServerInterceptor) CompleterOption {
	return func(o *completerOptions) {
		o.interceptors = append(o.interceptors, interceptors...)
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
		interval:       DefaultCompleteInterval,
		grace:          DefaultCompleteGrace,
		batch:          DefaultCompleteBatchSize,
		attempts:       DefaultCompleteMaxAttempts,
		listTimeout:    DefaultCompleteListTimeout,
		attemptTimeout: DefaultCompleteAttemptTimeout,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return &Completer{
		engine:    e,
		store:     cs,
		opts:      o,
		intercept: chainUnary(append(slices.Clone(o.interceptors), e.unary())),
		handlers:  map[string]completeHandler{},
	}, nil
}

// chainUnary returns one interceptor that runs ics in turn, the first
// outermost, as grpc.ChainUnaryInterceptor does. ics is not empty.
func chainUnary(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return ics[0](ctx, req, info, chainedHandler(ics, 0, info, handler))
	}
}

// chainedHandler is the handler that interceptor i of ics calls: the next
// interceptor, or, after the last one, handler.
func chainedHandler(ics []grpc.UnaryServerInterceptor, i int, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) grpc.UnaryHandler {
	if i == len(ics)-1 {
		return handler
	}
	return func(ctx context.Context, req any) (any, error) {
		return ics[i+1](ctx, req, info, chainedHandler(ics, i+1, info, handler))
	}
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
// pass. The error reports a failure to list the calls (within
// [WithCompleteListTimeout]); the calls the store listed all the same
// (those of the shards that answered, for a store of several databases)
// are taken on first.
func (c *Completer) Complete(ctx context.Context) (int, error) {
	list, err := c.list(ctx)
	done := 0
	for _, a := range list {
		if ctx.Err() != nil {
			return done, ctx.Err()
		}
		if c.attempt(ctx, a) {
			done++
		}
	}
	return done, err
}

// list returns the abandoned calls the store lists within the list
// timeout. A panic of the store's is an error of the pass.
func (c *Completer) list(ctx context.Context) (list []store.Abandoned, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.listTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			list, err = nil, fmt.Errorf("idem: listing abandoned calls panicked: %v", p)
		}
	}()
	return c.store.Abandoned(ctx, c.opts.grace, c.opts.batch)
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

// attempt runs complete for a within the attempt timeout. A panic on any
// of its paths (the store's, say, while the call is given up; a panic of
// the handler or an interceptor is the run's failure already) is logged
// and leaves the call for a later pass: one call never stops the others.
func (c *Completer) attempt(ctx context.Context, a store.Abandoned) (done bool) {
	defer func() {
		if p := recover(); p != nil {
			done = false
			c.engine.log(ctx, slog.LevelError, "idem: completing an abandoned call panicked; it is tried again later", a.Key, fmt.Errorf("%v", p))
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, c.opts.attemptTimeout)
	defer cancel()
	return c.complete(ctx, a)
}

// complete takes a over and runs it; it reports whether the call's outcome
// was recorded.
func (c *Completer) complete(ctx context.Context, a store.Abandoned) bool {
	if a.Unreadable != nil {
		return c.setAside(ctx, a, a.Unreadable)
	}
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
	var outcome Result
	cctx := context.WithValue(metadata.NewIncomingContext(ctx, md), completionCtxKey{}, completionRun{tenant: a.Key.Tenant})
	cctx = context.WithValue(cctx, outcomeCtxKey{}, &outcome)
	cctx = grpc.NewContextWithServerTransportStream(cctx, &completionStream{method: a.Completion.Method})
	var decodeErr error
	dec := func(req any) error {
		m, ok := req.(proto.Message)
		if !ok {
			decodeErr = fmt.Errorf("idem: the request is a %T, not a protobuf message", req)
			return decodeErr
		}
		decodeErr = proto.Unmarshal(a.Completion.Request, m)
		return decodeErr
	}
	_, err := c.run(cctx, h, dec)
	if decodeErr != nil {
		return c.setAside(ctx, a, fmt.Errorf("idem: the kept request is not a request of %s: %w", a.Completion.Method, decodeErr))
	}
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

// run calls the handler of h as grpc.Server would, with the Completer's
// interceptors and the engine's around it, and turns a panic into an
// error.
func (c *Completer) run(ctx context.Context, h completeHandler, dec func(any) error) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "idem: the handler panicked: %v", p)
		}
	}()
	return h.desc.Handler(h.srv, ctx, dec, c.intercept)
}

// giveUp records a's call as failed for good, taking it over first.
func (c *Completer) giveUp(ctx context.Context, a store.Abandoned) bool {
	msg := fmt.Sprintf("idem: the call was abandoned by its caller, and %d attempts to complete it failed; some of its steps may be done", a.Takeovers)
	if !c.recordFailed(ctx, a, msg) {
		return false
	}
	c.engine.log(ctx, slog.LevelError, "idem: gave up completing an abandoned call; it is recorded as failed", a.Key, nil)
	c.report(ctx, a, ResultNotCompleted)
	return true
}

// setAside records a's call, which cannot be run again because what was
// kept of it cannot be read (why says how), as failed for good, so that it
// leaves the list of abandoned calls and its retries get an answer. It is
// logged at ERROR with the call's scope, never with what was kept.
func (c *Completer) setAside(ctx context.Context, a store.Abandoned, why error) bool {
	c.engine.log(ctx, slog.LevelError, "idem: an abandoned call cannot be finished: what was kept of it cannot be read; it is recorded as failed", a.Key, why)
	if !c.recordFailed(ctx, a, "idem: the call was abandoned by its caller, and what was kept to finish it cannot be read; some of its steps may be done") {
		return false
	}
	c.report(ctx, a, ResultUnreadable)
	return true
}

// recordFailed takes a's call over, as a retry would, and records it as
// failed, FAILED_PRECONDITION with ErrorInfo reason ReasonNotCompleted and
// message msg. The takeover's fencing token keeps the record from
// replacing the outcome of a retry or another completer that took the call
// meanwhile. It reports whether the outcome was recorded.
func (c *Completer) recordFailed(ctx context.Context, a store.Abandoned, msg string) bool {
	lc, err := c.engine.store.Lease(ctx, a.Key, store.Request{Fingerprint: a.Fingerprint}, time.Minute)
	if err != nil {
		c.engine.log(ctx, slog.LevelWarn, "idem: taking an abandoned call over to record it as failed failed; it is tried again later", a.Key, err)
		return false
	}
	if lc.Lease == nil {
		return false // a retry or another completer holds it, or recorded it
	}
	st, _ := status.New(codes.FailedPrecondition, msg).
		WithDetails(&errdetails.ErrorInfo{Reason: ReasonNotCompleted, Domain: Domain})
	body, _, err := encodeOutcome(st.Code(), st.Proto(), nil, nil)
	if err == nil {
		err = lc.Lease.Complete(ctx, store.Outcome{Code: st.Code(), Body: body})
	}
	if err != nil {
		_ = lc.Lease.Release(ctx)
		c.engine.log(ctx, slog.LevelWarn, "idem: recording an abandoned call as failed failed; it is tried again later", a.Key, err)
		return false
	}
	return true
}

// report reports the outcome r of a's call, which the Completer recorded
// without running it.
func (c *Completer) report(ctx context.Context, a store.Abandoned, r Result) {
	method := a.Completion.Method
	if method == "" {
		method = a.Key.Method
	}
	c.engine.report(ctx, &callState{method: method, mode: ModeLeased, result: r, started: time.Now(), key: a.Key, completion: true})
}

// outcomeCtxKey carries where the Engine writes a call's result, for the
// Completer.
type outcomeCtxKey struct{}

// completionStream is the grpc.ServerTransportStream of a call a Completer
// runs. It keeps the response metadata set on it, as a server's stream
// would before sending it, and sends nothing: the engine's adapter records
// what the handler set with the outcome, as on a call the server receives.
type completionStream struct {
	method string

	mu              sync.Mutex
	header, trailer metadata.MD
	sent            bool
}

// errHeaderSent is what grpc-go's stream answers to setting the header
// once it was sent.
var errHeaderSent = status.Error(codes.Internal, "transport: the stream is done or WriteHeader was already called")

func (s *completionStream) Method() string { return s.method }

func (s *completionStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent {
		return errHeaderSent
	}
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *completionStream) SendHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent {
		return errHeaderSent
	}
	s.header = metadata.Join(s.header, md)
	s.sent = true
	return nil
}

func (s *completionStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}
