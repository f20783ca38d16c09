package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemkit/idem/fingerprint"
	"github.com/idemkit/idem/internal/bridge"
	"github.com/idemkit/idem/store"
)

// Engine runs keyed unary calls for a transport: it checks the key, claims
// it in the store, runs the handler, records its outcome and replays it.
// Each transport's adapter puts an Engine behind that transport's API:
// grpc-go's (package interceptor), connect-go's (package idemconnect),
// and, through the gRPC server it proxies to, grpc-gateway's (package
// idemgateway). So every transport serves one
// contract, with one store, one fingerprint and one scope: a gRPC call and
// its retry over HTTP are the same operation.
//
// An Engine is safe for concurrent use.
type Engine struct {
	store   store.Store
	opts    *options
	hasher  *fingerprint.Hasher
	methods *methods
	obs     *observer
	// counter counts replays: the store, when it implements
	// store.ReplayCounter and WithReplayCounts left counting on; else nil.
	counter store.ReplayCounter
}

// New returns an Engine on s. It checks the per-method options against the
// protobuf registry: a method an option names must be a unary method of a
// registered service, so that a misspelt name fails here, at start-up,
// rather than being ignored.
func New(s store.Store, opts ...Option) (*Engine, error) {
	if s == nil {
		return nil, errors.New("idem: New needs a store")
	}
	o := evaluateOptions(opts)
	ms := newMethods(o)
	if err := ms.check(); err != nil {
		return nil, err
	}
	e := &Engine{
		store:   s,
		opts:    o,
		hasher:  fingerprint.NewHasher(o.fingerprint...),
		methods: ms,
		obs:     newObserver(o),
	}
	if c, ok := s.(store.ReplayCounter); ok && !o.uncounted {
		e.counter = c
	}
	return e, nil
}

// answer is what the transport sends back for a call, besides the error:
// [bridge.Answer] with idem's Result, and the message a binary protobuf
// codec sends (see transport.Answer.WireMessage).
type answer struct {
	Message         proto.Message
	Header, Trailer map[string][]string
	Result          Result
	// wire is Message as a binary protobuf codec must send it, when that
	// differs from Message: the recorded bytes, exactly, for response
	// types whose encoding is not canonical (maps, extensions), carried as
	// the unknown fields of an empty message.
	wire proto.Message
}

// handle runs call: the handler once per key, its recorded outcome to every
// retry. Its error is the handler's own, returned as the handler returned
// it, or an [*Error] of idem's (its own refusals and a recorded error
// replayed), which the transport maps to its wire. It reports the call's
// result to the metrics, traces and hook ([WithReportHook]). Transports
// reach it through transport.Handle.
func (e *Engine) handle(ctx context.Context, call bridge.Call, h bridge.Handler) (answer, error) {
	c := &callState{engine: e, method: call.Method, started: time.Now(), statusOf: call.Status}
	run, _ := ctx.Value(finishCtxKey{}).(*finishRun)
	c.finishing = run != nil
	// The method value h.Run does not escape: only the transport's own
	// handler behind it does.
	ans, err := e.run(ctx, c, call, run, h.Run)
	c.result = ans.Result
	c.replayed = ans.Result == ResultReplayed || ans.Result == ResultRebuilt
	if run != nil {
		run.result = ans.Result
	} else if c.replayed && e.counter != nil {
		e.counter.CountReplay(c.key) // in memory: the store writes it later
	}
	e.report(ctx, c)
	return ans, err
}

// handler runs the handler of a call, as [bridge.Handler.Run].
type handler func(ctx context.Context) (bridge.Reply, error)

// callState follows one call to its outcome.
type callState struct {
	engine        *Engine
	method        string
	mode          Mode
	result        Result
	replayed      bool
	started       time.Time
	claim, record time.Duration
	tookOver      bool // a leased claim took the key over
	key           store.Scope
	m             *method
	expires       time.Time // when the key this call claimed stops counting
	finishing     bool      // the call is run by a Finisher
	optimistic    bool      // the claim being recorded read nothing first
	readNothing   bool      // the call's first claim read nothing (Report.Optimistic)
	// request is the request's deterministic encoding, recorded with the
	// outcome for an operator (MethodPolicy.KeepRequest); nil for none.
	request []byte

	statusOf func(error) (*spb.Status, bool) // Call.Status
}

// status returns the google.rpc.Status err carries, and whether it carries
// one: an [*Error]'s (not wrapped: a transport sends a wrapped one as it
// sends any other error), or one the transport reads.
func (c *callState) status(err error) (*spb.Status, bool) {
	if ie, ok := err.(*Error); ok {
		return ie.status, true
	}
	if c.statusOf != nil {
		return c.statusOf(err)
	}
	return nil, false
}

// handlerStatus is the status of a handler's error: the one it carries,
// else UNKNOWN with the error's text, as gRPC and Connect send it.
func (c *callState) handlerStatus(err error) *spb.Status {
	if st, ok := c.status(err); ok {
		return st
	}
	return &spb.Status{Code: int32(code.Code_UNKNOWN), Message: err.Error()}
}

// refuse is the answer of a call idem ended as r without running it.
func refuse(r Result, err error) (answer, error) {
	return answer{Result: r}, err
}

func (e *Engine) run(ctx context.Context, c *callState, call bridge.Call, run *finishRun, h handler) (answer, error) {
	m := e.methods.lookup(call.Method)
	c.m = m
	c.mode = m.mode
	if call.KeyError != nil {
		return refuse(ResultInvalidKey, invalidKey(call.KeyError.Error()))
	}
	keys, err := requestKeys(m, call)
	if err != nil {
		return refuse(ResultInvalidKey, err)
	}
	key, ok, err := keyFrom(keys)
	if err != nil {
		return refuse(ResultInvalidKey, invalidKey(err.Error()))
	}
	if m.exempt {
		// idem stands aside, and ignores a key, but not a malformed one
		// (checked above): that is the client's bug to hear about.
		return e.passThrough(ctx, h)
	}
	if !ok {
		if m.required {
			return refuse(ResultMissingKey, missingKey(call.Method))
		}
		return e.passThrough(ctx, h)
	}
	if m.output == nil {
		return refuse(ResultStoreError, NewError(code.Code_INTERNAL, "idem: "+call.Method+" is not in the protobuf registry, so its responses cannot be replayed"))
	}
	if call.Request == nil {
		return refuse(ResultStoreError, NewError(code.Code_INTERNAL, "idem: "+call.Method+" has no request message"))
	}
	tenant, err := e.tenant(ctx, call, run)
	if err != nil {
		if _, ok := c.status(err); ok {
			return refuse(ResultInvalidKey, err)
		}
		return refuse(ResultInvalidKey, NewError(code.Code_UNAUTHENTICATED, err.Error()))
	}
	scope := call.Method
	if m.scope != "" {
		scope = m.scope
	}
	skey := store.Scope{Tenant: tenant, Method: scope, Key: key}
	c.key = skey
	if err := skey.Validate(); err != nil {
		return refuse(ResultInvalidKey, scopeInvalid(err))
	}
	fp, err := e.hasher.Sum(call.Request)
	if err != nil {
		return refuse(ResultInvalidKey, NewError(code.Code_INVALID_ARGUMENT, "idem: "+err.Error()))
	}

	// The handler reads its key where its request carries one: a key
	// that came in the metadata alone goes in the request's key field too
	// (left out of the fingerprint, as the field always is).
	if msg, fd := keyField(m, call.Request); fd != nil && msg.Get(fd).String() == "" {
		msg.Set(fd, protoreflect.ValueOfString(key))
	}

	if m.keepRequest {
		c.request = e.keptRequest(call.Request)
	}

	header := call.Header
	if run != nil {
		header = nil // a finisher's run is never a first attempt
	}
	ctx = withRequestKey(ctx, skey, header)
	switch m.mode {
	case ModeLeased:
		return e.lease(ctx, c, fp, call, h)
	case ModeAuto:
		// The client's mark chooses how to start, never the outcome: the
		// key's row decides that either way.
		return e.atomic(ctx, c, fp, h, attemptOf(header) == firstAttempt, nil)
	}
	return e.atomic(ctx, c, fp, h, m.mode == ModeOptimistic, nil)
}

// atomic runs a call in atomic mode, or in optimistic mode: the store reads
// nothing before the handler runs, and a record that finds the key taken
// by another request (store.ErrConflict) rolls the handler's writes back;
// the call then claims the key again, as in atomic mode, and answers from
// what the other request left, most often its recorded outcome.
//
// A handler that fails under an optimistic claim may have failed because
// of the key itself: its own write of a row that the request that
// recorded the key wrote too (a unique violation), or that a duplicate in
// flight holds. So its writes are rolled back and the key is claimed
// again as in atomic mode, with failed holding what the handler answered:
// the call answers from what another request left under the key, if
// anything, and otherwise answers the failure as atomic mode does,
// recording a deterministic error and releasing the key on any other,
// without running the handler again.
func (e *Engine) atomic(ctx context.Context, c *callState, fp []byte, h handler, optimistic bool, failed *failure) (answer, error) {
	c.readNothing = c.readNothing || optimistic
	cctx, t := e.obs.start(ctx, c, spanClaim)
	claim, err := e.store.Claim(cctx, c.key, store.ClaimRequest{Fingerprint: fp, TTL: c.m.ttl, Optimistic: optimistic})
	c.claim += t.end(err)
	c.expires = claim.ExpiresAt
	if err != nil {
		return e.storeError(ctx, c, "claiming the idempotency key", err)
	}
	if claim.Entry != nil {
		return e.replay(ctx, c, h, fp, claim.Entry)
	}
	defer func() { _ = claim.Txn.Release(ctx) }()
	if failed != nil {
		// The handler ran already, on a transaction rolled back since:
		// nothing of this one is handed to it.
		return e.execute(ctx, c, failed.handler, claim.Txn)
	}
	run := h
	if optimistic {
		c.optimistic = true
		run = func(ctx context.Context) (bridge.Reply, error) {
			r, err := h(ctx)
			if err != nil && ctx.Err() == nil {
				return r, &failure{reply: r, err: err}
			}
			return r, err
		}
	}
	a, err := e.execute(claim.Txn.Context(ctx), c, run, claim.Txn)
	c.optimistic = false
	switch f := (*failure)(nil); {
	case errors.Is(err, errTaken):
		_ = claim.Txn.Release(ctx)
		return e.atomic(ctx, c, fp, h, false, nil)
	case errors.As(err, &f):
		_ = claim.Txn.Release(ctx)
		return e.atomic(ctx, c, fp, h, false, f)
	}
	return a, err
}

// errTaken reports, from [Engine.record], that an optimistic claim's record
// found the key taken by another request.
var errTaken = errors.New("idem: the key was taken by another request")

// failure is what a handler answered when it failed under an optimistic
// claim, which [Engine.atomic] answers once it knows what the key holds.
// A handler that fails after its caller has gone is answered at once, as
// in atomic mode: nobody waits for the answer.
type failure struct {
	reply bridge.Reply
	err   error
}

func (f *failure) Error() string { return f.err.Error() }

// handler answers as the handler that failed did, without running it.
func (f *failure) handler(context.Context) (bridge.Reply, error) { return f.reply, f.err }

// keyFrom returns the call's key and whether it carried one. A key that is
// present but invalid is an error naming the rule it breaks.
func keyFrom(keys []string) (key string, ok bool, err error) {
	switch len(keys) {
	case 0:
		return "", false, nil
	case 1:
		return keys[0], true, validateKey(keys[0])
	}
	return "", true, errTooManyKeys(len(keys))
}

// tenant returns the call's tenant: the one a Finisher kept with the call,
// or the resolver's.
func (e *Engine) tenant(ctx context.Context, call bridge.Call, run *finishRun) (string, error) {
	if run != nil {
		return run.tenant, nil
	}
	return e.opts.tenant(ctx, call.Header)
}

// finishing returns what a Finisher needs to run call, of method m, again:
// its method, its request in deterministic encoding, and the request
// metadata m's policy names (FinishHeaders).
func (e *Engine) finishing(m *method, call bridge.Call) (*store.Call, error) {
	req, err := proto.MarshalOptions{Deterministic: true}.Marshal(call.Request)
	if err != nil {
		return nil, err
	}
	c := &store.Call{Method: call.Method, Request: req, Metadata: map[string][]string{}}
	for _, k := range m.finishHeaders {
		if v := call.Header[k]; len(v) > 0 {
			c.Metadata[k] = v
		}
	}
	return c, nil
}

// keptRequest returns the deterministic encoding of req to record with
// its outcome: nil, keeping nothing, when it is larger than the responses
// the engine records (WithMaxStoredResponseBytes) or cannot be encoded,
// which only an operator's view of the key misses.
func (e *Engine) keptRequest(req proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil || len(b) > e.opts.maxStored {
		return nil
	}
	return b
}

// requestKeys returns the values of the call's key: the transport's, or
// else the one its request carries in the field marked
// (idem.v1.field).key. A request field and a transport key that differ are
// refused, with the status the client gets.
func requestKeys(m *method, call bridge.Call) ([]string, error) {
	msg, fd := keyField(m, call.Request)
	if fd == nil {
		return call.Keys, nil
	}
	v := msg.Get(fd).String()
	switch {
	case v == "":
		return call.Keys, nil
	case len(call.Keys) == 0:
		if err := validateKey(v); err != nil {
			return nil, invalidKey(fmt.Sprintf("the request's field %s %v", fieldName(m.keyField), err))
		}
		return []string{v}, nil
	case len(call.Keys) == 1 && call.Keys[0] == v:
		return call.Keys, nil
	}
	return nil, keysDiffer(string(m.keyField.Name()))
}

// fieldName names fd for a client: its name, and its JSON name when that
// differs.
func fieldName(fd protoreflect.FieldDescriptor) string {
	if fd.JSONName() == string(fd.Name()) {
		return string(fd.Name())
	}
	return fmt.Sprintf("%s (%s in JSON)", fd.Name(), fd.JSONName())
}

// passThrough runs a call idem stands aside from.
func (e *Engine) passThrough(ctx context.Context, h handler) (answer, error) {
	r, err := h(ctx)
	return answer{Message: r.Message, Result: ResultPassthrough}, err
}

// lease runs a call in leased mode: the claim is committed before the
// handler runs, a heartbeat extends it while the handler runs, and the
// outcome is recorded only while the claim is still this call's.
//
// The claim's bookkeeping (the heartbeat, recording the outcome, releasing
// the claim) runs on a context detached from the caller's, each store call
// with a bound of its own (see extendTimeout and leaseRecordTimeout): it
// lasts as long as the handler, which may well finish its side effect after
// its client has gone. Only a transient error or a panic of the handler
// releases the claim. When recording the outcome of a handler that
// succeeded or failed deterministically fails, the claim stays in progress
// and its lease runs out on its own, so that a retry takes the call over
// (resuming after its recorded steps) rather than running it afresh.
func (e *Engine) lease(ctx context.Context, c *callState, fp []byte, call bridge.Call, h handler) (answer, error) {
	m, key := c.m, c.key
	r := store.LeaseRequest{Fingerprint: fp, TTL: m.ttl, Lease: m.lease}
	if m.finish {
		var err error
		if r.Call, err = e.finishing(m, call); err != nil {
			return refuse(ResultStoreError, e.internalError(ctx, key, code.Code_INTERNAL, "encoding the request for finishing failed", err))
		}
	}
	cctx, t := e.obs.start(ctx, c, spanClaim)
	lc, err := e.store.ClaimLeased(cctx, key, r)
	c.claim = t.end(err)
	c.expires = lc.ExpiresAt
	if errors.Is(err, store.ErrCorrupt) {
		return refuse(ResultStoreError, e.stepsUnreadable(ctx, c, err))
	}
	if err != nil {
		return e.storeError(ctx, c, "leasing the idempotency key", err)
	}
	if lc.Entry != nil {
		return e.replay(ctx, c, h, fp, lc.Entry)
	}
	l := lc.Lease
	c.tookOver = lc.TookOver
	bctx := context.WithoutCancel(ctx)
	release := true // until the handler returns an outcome to record
	defer func() {
		if release {
			rctx, cancel := context.WithTimeout(bctx, leaseRecordTimeout)
			defer cancel()
			_ = l.Release(rctx)
		}
	}()

	cl := &callLease{Lease: l, d: m.lease}
	hctx, cancel := context.WithCancelCause(context.WithValue(ctx, leaseCtxKey{}, cl))
	defer cancel(nil)
	cl.lost = cancel
	stop := e.heartbeat(bctx, key, l, m.lease, cancel)
	defer stop() // when the handler panics
	rec := &leaseRecorder{lease: l, stop: stop}
	ans, err := e.execute(hctx, c, func(ctx context.Context) (bridge.Reply, error) {
		r, err := h(ctx)
		release = err != nil && !e.opts.classifier(c.handlerStatus(err))
		return r, err
	}, rec)
	stop()
	if errors.Is(err, store.ErrLeaseLost) || errors.Is(context.Cause(hctx), store.ErrLeaseLost) {
		e.log(ctx, slog.LevelWarn, "idem: the lease on an idempotency key was lost (it ran out and another request took the key over, or a failover lost the key's row); this call's outcome was not recorded", key, nil)
		return refuse(ResultLeaseLost, leaseLost(e.opts.retryDelay))
	}
	if rec.err != nil {
		e.log(ctx, slog.LevelError, "idem: storage failed while recording the outcome of a leased call; its claim stays in progress until the lease runs out", key, rec.err)
		return refuse(ResultStoreError, notRecorded(min(m.lease, maxLeaseRetryDelay), e.detail(rec.err)))
	}
	return ans, err
}

// Bounds of the store calls that keep a leased claim, which run on a context
// detached from the caller's.
const (
	// leaseRecordTimeout bounds recording a leased call's outcome and
	// releasing its claim.
	leaseRecordTimeout = 5 * time.Second
	// maxExtendTimeout caps the bound of one Extend of the heartbeat.
	maxExtendTimeout = 5 * time.Second
)

// extendTimeout bounds one Extend of a lease of length d: a third of d, so
// that a beat that hangs gives up while the lease still runs for the next
// beat to extend it, and at most maxExtendTimeout.
func extendTimeout(d time.Duration) time.Duration {
	return min(max(d/3, time.Millisecond), maxExtendTimeout)
}

// recorder is the owned claim execute records into: a store.Txn or a
// leaseRecorder.
type recorder interface {
	Record(ctx context.Context, out store.Outcome) error
}

// execute runs the handler and records its outcome in rec. On an error it
// records nothing and leaves the claim to the caller's deferred release.
func (e *Engine) execute(ctx context.Context, c *callState, h handler, rec recorder) (answer, error) {
	m, key := c.m, c.key
	r, herr := h(ctx)
	if f, ok := herr.(*failure); ok {
		return answer{}, f // for atomic, which learns what the key holds first
	}
	if herr != nil {
		st := c.handlerStatus(herr)
		if st.GetCode() == int32(code.Code_OK) || !e.opts.classifier(st) {
			return refuse(ResultTransient, herr) // the deferred release discards the claim
		}
		body, _, err := encodeOutcome(code.Code(st.GetCode()), st, r.Header, r.Trailer, c.request)
		if err != nil {
			return refuse(ResultStoreError, e.internalError(ctx, key, code.Code_INTERNAL, "encoding the error failed", err))
		}
		if a, err := e.record(ctx, c, rec, store.Outcome{Code: code.Code(st.GetCode()), Body: body}); err != nil {
			return a, err
		}
		return answer{Header: expiresHeader(c.expires), Result: ResultExecuted}, herr
	}
	if r.Message == nil {
		return refuse(ResultStoreError, NewError(code.Code_INTERNAL, "idem: the handler returned no response message"))
	}
	body, payload, err := encodeOutcome(code.Code_OK, r.Message, r.Header, r.Trailer, c.request)
	if err != nil {
		return refuse(ResultStoreError, e.internalError(ctx, key, code.Code_INTERNAL, "encoding the response failed", err))
	}
	out := store.Outcome{Body: body}
	if len(payload) > e.opts.maxStored {
		// Too large to keep: record a reference, or nothing, instead.
		out = store.Outcome{NotCached: true}
		if m.loader != nil {
			if out.Body, err = m.loader.Reference(ctx, r.Message); err != nil {
				return refuse(ResultTransient, err)
			}
		}
	}
	if a, err := e.record(ctx, c, rec, out); err != nil {
		return a, err
	}
	ans := answer{Message: r.Message, Header: expiresHeader(c.expires), Result: ResultExecuted}
	if m.raw {
		ans.wire = rawMessage(m, payload)
	}
	return ans, nil
}

// record records out in rec, timing it. A failure is returned as the
// status the client gets, except a leased call's, which is passed on as it
// is, for lease to report (and log).
func (e *Engine) record(ctx context.Context, c *callState, rec recorder, out store.Outcome) (answer, error) {
	rctx, t := e.obs.start(ctx, c, spanRecord)
	err := rec.Record(rctx, out)
	c.record = t.end(err)
	if err == nil {
		return answer{}, nil
	}
	if c.optimistic && errors.Is(err, store.ErrConflict) {
		return answer{}, errTaken
	}
	if _, leased := rec.(*leaseRecorder); leased || errors.Is(err, store.ErrLeaseLost) {
		return refuse(ResultStoreError, err)
	}
	return e.storeError(ctx, c, "recording the outcome", err)
}

// leaseRecorder records the outcome of a leased call. It stops the
// heartbeat first, so that the heartbeat never mistakes the recorded claim
// for a lost lease, and records on a context detached from the caller's
// (bounded by leaseRecordTimeout), so that an outcome reached after the
// caller has gone is still kept. It keeps the error of the record.
type leaseRecorder struct {
	lease store.Lease
	stop  func()
	err   error
}

func (r *leaseRecorder) Record(ctx context.Context, out store.Outcome) error {
	r.stop()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseRecordTimeout)
	defer cancel()
	r.err = r.lease.Record(ctx, out)
	return r.err
}

// heartbeat extends l, the lease of key, every third of d until stop is
// called (stop may be called more than once), each Extend bounded by
// extendTimeout(d). ctx should be detached from the caller's: the lease is
// kept while the handler runs, whether or not its caller still waits. When
// the lease turns out to be lost it cancels the handler's context with
// store.ErrLeaseLost and stops; other failures are logged and retried at
// the next beat, while the lease may still run.
func (e *Engine) heartbeat(ctx context.Context, key store.Scope, l store.Lease, d time.Duration, cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(max(d/3, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ectx, cancelExtend := context.WithTimeout(ctx, extendTimeout(d))
			err := l.Extend(ectx, d)
			cancelExtend()
			switch {
			case errors.Is(err, store.ErrLeaseLost):
				cancel(store.ErrLeaseLost)
				return
			case err != nil && ctx.Err() == nil:
				e.log(ctx, slog.LevelWarn, "idem: extending a lease failed", key, err)
			case err == nil:
				e.obs.extended(ctx, key.Method)
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// replay answers a call whose key another request took.
func (e *Engine) replay(ctx context.Context, c *callState, h handler, fp []byte, en *store.Entry) (answer, error) {
	m, key := c.m, c.key
	if !bytes.Equal(en.Fingerprint, fp) {
		return refuse(ResultReused, keyReused())
	}
	if en.State != store.Recorded {
		delay := e.opts.retryDelay
		if en.LeaseRemaining > 0 {
			delay = min(en.LeaseRemaining, maxLeaseRetryDelay)
		}
		return refuse(ResultInUse, keyInUse(delay))
	}
	if en.Outcome.NotCached {
		return e.rebuild(ctx, c, h, en)
	}
	rec, err := decode(m, en.Outcome)
	if err != nil {
		e.log(ctx, slog.LevelError, "idem: the recorded outcome cannot be replayed", key, err)
		return refuse(ResultStoreError, NewError(code.Code_INTERNAL, "idem: the recorded outcome of this request is unreadable"))
	}
	ans := answer{Header: replayHeader(rec.header, en.ExpiresAt), Trailer: rec.trailer, Result: ResultReplayed}
	if en.Outcome.Code != 0 {
		return ans, &Error{status: rec.msg.(*spb.Status)}
	}
	ans.Message = rec.msg
	if m.raw {
		ans.wire = rawMessage(m, rec.payload)
	}
	return ans, nil
}

// maxLeaseRetryDelay caps the retry delay suggested while a lease runs.
const maxLeaseRetryDelay = 30 * time.Second

// rebuild answers a retry of a call whose response was too large to record.
func (e *Engine) rebuild(ctx context.Context, c *callState, h handler, en *store.Entry) (answer, error) {
	m, key := c.m, c.key
	switch {
	case m.loader != nil:
		resp, err := m.loader.Load(ctx, en.Outcome.Body)
		if err != nil {
			if _, ok := c.status(err); ok {
				return refuse(ResultStoreError, err)
			}
			return refuse(ResultStoreError, e.internalError(ctx, key, code.Code_UNAVAILABLE, "rebuilding the response failed", err))
		}
		return answer{Message: resp, Header: replayHeader(nil, en.ExpiresAt), Result: ResultRebuilt}, nil
	case m.rerun:
		r, err := h(ctx)
		return answer{Message: r.Message, Result: ResultRerun}, err
	}
	return refuse(ResultNotCached, notCached())
}

// expiresHeader is the header that tells the client when its key stops
// counting; none when the time is unknown.
func expiresHeader(t time.Time) map[string][]string {
	if t.IsZero() {
		return nil
	}
	return map[string][]string{ExpiresHeader: {t.UTC().Format(time.RFC3339)}}
}

// replayHeader is the header of a replay: the recorded one, the replay
// marker and the key's expiry.
func replayHeader(recorded map[string][]string, expires time.Time) map[string][]string {
	h := make(map[string][]string, len(recorded)+2)
	for k, v := range recorded {
		h[k] = v
	}
	h[ReplayedHeader] = append(h[ReplayedHeader][:len(h[ReplayedHeader]):len(h[ReplayedHeader])], "true")
	if !expires.IsZero() {
		h[ExpiresHeader] = append(h[ExpiresHeader][:len(h[ExpiresHeader]):len(h[ExpiresHeader])], expires.UTC().Format(time.RFC3339))
	}
	return h
}

// rawMessage returns an empty response whose unknown fields are body, so that
// a binary protobuf codec sends body as it is.
func rawMessage(m *method, body []byte) proto.Message {
	r := m.output.New()
	r.SetUnknown(body)
	return r.Interface()
}
