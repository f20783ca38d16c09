package interceptor

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/fingerprint"
	"github.com/idemkit/idem/store"
)

// UnaryServerInterceptor returns a server interceptor that runs each keyed
// unary call once per key and replays its recorded outcome to retries. See
// the package documentation for the flow and the status codes.
func UnaryServerInterceptor(s store.Store, opts ...ServerOption) grpc.UnaryServerInterceptor {
	o := evaluateServerOptions(opts)
	i := &server{
		store:   s,
		opts:    o,
		hasher:  fingerprint.NewHasher(o.fingerprint...),
		methods: newMethods(o),
	}
	return i.intercept
}

type server struct {
	store   store.Store
	opts    *serverOptions
	hasher  *fingerprint.Hasher
	methods *methods
}

func (i *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m := i.methods.lookup(info.FullMethod)
	if m.exempt {
		return handler(ctx, req)
	}
	key, ok, err := keyFromMetadata(ctx)
	if err != nil {
		return nil, invalidKey(err.Error())
	}
	if !ok {
		if m.required {
			return nil, invalidKey("required by " + info.FullMethod)
		}
		return handler(ctx, req)
	}
	if m.output == nil {
		return nil, status.Errorf(codes.Internal, "idem: %s is not in the protobuf registry, so its responses cannot be replayed", info.FullMethod)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idem: request of %s is %T, not a protobuf message", info.FullMethod, req)
	}
	tenant, err := i.opts.tenant.Tenant(ctx)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	skey := store.Key{Tenant: tenant, Method: info.FullMethod, Key: key}
	if err := skey.Validate(); err != nil {
		return nil, scopeInvalid(err)
	}
	fp, err := i.hasher.Sum(msg)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "idem: "+err.Error())
	}

	ctx = withRequestKey(ctx, skey)
	if m.leased {
		return i.lease(ctx, skey, fp, req, m, handler)
	}
	claim, err := i.store.Claim(ctx, skey, fp)
	if err != nil {
		return nil, i.storeError(ctx, skey, "claiming the idempotency key", err)
	}
	if claim.Entry != nil {
		return i.replay(ctx, skey, req, m, handler, fp, claim.Entry)
	}
	defer func() { _ = claim.Txn.Release(ctx) }()
	return i.execute(claim.Txn.Context(ctx), skey, req, m, handler, claim.Txn)
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
// (resuming from its recovery point) rather than running it afresh.
func (i *server) lease(ctx context.Context, key store.Key, fp []byte, req any, m *method, handler grpc.UnaryHandler) (any, error) {
	lc, err := i.store.Lease(ctx, key, fp, m.lease)
	if err != nil {
		return nil, i.storeError(ctx, key, "leasing the idempotency key", err)
	}
	if lc.Entry != nil {
		return i.replay(ctx, key, req, m, handler, fp, lc.Entry)
	}
	l := lc.Lease
	bctx := context.WithoutCancel(ctx)
	release := true // until the handler returns an outcome to record
	defer func() {
		if release {
			rctx, cancel := context.WithTimeout(bctx, leaseRecordTimeout)
			defer cancel()
			_ = l.Release(rctx)
		}
	}()

	hctx, cancel := context.WithCancelCause(context.WithValue(ctx, leaseCtxKey{}, l))
	defer cancel(nil)
	stop := i.heartbeat(bctx, key, l, m.lease, cancel)
	defer stop() // when the handler panics
	rec := &leaseRecorder{lease: l, stop: stop}
	resp, err := i.execute(hctx, key, req, m, func(ctx context.Context, req any) (any, error) {
		resp, err := handler(ctx, req)
		release = err != nil && !i.opts.classifier.Deterministic(status.Convert(err))
		return resp, err
	}, rec)
	stop()
	if errors.Is(err, store.ErrLeaseLost) || errors.Is(context.Cause(hctx), store.ErrLeaseLost) {
		i.log(ctx, slog.LevelWarn, "idem: the lease on an idempotency key ran out and another request took it over; this call's outcome was not recorded", key, nil)
		return nil, leaseLost(i.opts.retryDelay)
	}
	if rec.err != nil {
		i.log(ctx, slog.LevelError, "idem: storage failed while recording the outcome of a leased call; its claim stays in progress until the lease runs out", key, rec.err)
		return nil, notRecorded(min(m.lease, maxLeaseRetryDelay), i.detail(rec.err))
	}
	return resp, err
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
	Complete(ctx context.Context, out store.Outcome) error
}

// execute runs the handler and records its outcome in rec. On an error it
// records nothing and leaves the claim to the caller's deferred release.
func (i *server) execute(ctx context.Context, key store.Key, req any, m *method, handler grpc.UnaryHandler, rec recorder) (any, error) {
	resp, herr := handler(ctx, req)
	if herr != nil {
		st := status.Convert(herr)
		if !i.opts.classifier.Deterministic(st) {
			return nil, herr // transient: the deferred release discards the claim
		}
		body, _, err := encodeOutcome(st.Code(), st.Proto())
		if err != nil {
			return nil, i.internalError(ctx, key, codes.Internal, "encoding the error failed", err)
		}
		if err := rec.Complete(ctx, store.Outcome{Code: st.Code(), Body: body}); err != nil {
			return nil, i.completeError(ctx, key, rec, err)
		}
		return nil, st.Err()
	}
	msg, ok := resp.(proto.Message)
	if !ok || msg == nil {
		return nil, status.Errorf(codes.Internal, "idem: response is %T, not a protobuf message", resp)
	}
	body, payload, err := encodeOutcome(codes.OK, msg)
	if err != nil {
		return nil, i.internalError(ctx, key, codes.Internal, "encoding the response failed", err)
	}
	out := store.Outcome{Code: codes.OK, Body: body}
	if len(payload) > i.opts.maxStored {
		// Too large to keep: record a reference, or nothing, instead.
		out = store.Outcome{Code: codes.OK, NotCached: true}
		if m.loader != nil {
			if out.Body, err = m.loader.Reference(ctx, msg); err != nil {
				return nil, err
			}
		}
	}
	if err := rec.Complete(ctx, out); err != nil {
		return nil, i.completeError(ctx, key, rec, err)
	}
	if m.raw {
		return rawMessage(m, payload), nil
	}
	return resp, nil
}

// completeError maps a failure of rec to record. A leased call's failure is
// passed on as it is, for lease to report (and log).
func (i *server) completeError(ctx context.Context, key store.Key, rec recorder, err error) error {
	if _, leased := rec.(*leaseRecorder); leased || errors.Is(err, store.ErrLeaseLost) {
		return err
	}
	return i.storeError(ctx, key, "recording the outcome", err)
}

// leaseRecorder records the outcome of a leased call. It stops the
// heartbeat first, so that the heartbeat never mistakes the completed claim
// for a lost lease, and records on a context detached from the caller's
// (bounded by leaseRecordTimeout), so that an outcome reached after the
// caller has gone is still kept. It keeps the error of the record.
type leaseRecorder struct {
	lease store.Lease
	stop  func()
	err   error
}

func (r *leaseRecorder) Complete(ctx context.Context, out store.Outcome) error {
	r.stop()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseRecordTimeout)
	defer cancel()
	r.err = r.lease.Complete(ctx, out)
	return r.err
}

// heartbeat extends l, the lease of key, every third of d until stop is
// called (stop may be called more than once), each Extend bounded by
// extendTimeout(d). ctx should be detached from the caller's: the lease is
// kept while the handler runs, whether or not its caller still waits. When
// the lease turns out to be lost it cancels the handler's context with
// store.ErrLeaseLost and stops; other failures are logged and retried at
// the next beat, while the lease may still run.
func (i *server) heartbeat(ctx context.Context, key store.Key, l store.Lease, d time.Duration, cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
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
				i.log(ctx, slog.LevelWarn, "idem: extending a lease failed", key, err)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// replay answers a request for key, which another request took.
func (i *server) replay(ctx context.Context, key store.Key, req any, m *method, handler grpc.UnaryHandler, fp []byte, e *store.Entry) (any, error) {
	if !bytes.Equal(e.Fingerprint, fp) {
		return nil, keyReused()
	}
	if e.State != store.Completed {
		delay := i.opts.retryDelay
		if e.LeaseRemaining > 0 {
			delay = min(e.LeaseRemaining, maxLeaseRetryDelay)
		}
		return nil, keyInUse(delay)
	}
	if e.Outcome.NotCached {
		return i.rebuild(ctx, key, req, m, handler, e.Outcome.Body)
	}
	resp, err := decode(m, e.Outcome)
	if err != nil {
		i.log(ctx, slog.LevelError, "idem: the recorded outcome cannot be replayed", key, err)
		return nil, status.Error(codes.Internal, "idem: the recorded outcome of this request is unreadable")
	}
	setReplayed(ctx)
	if e.Outcome.Code != codes.OK {
		return nil, status.ErrorProto(resp.(*spb.Status))
	}
	return resp, nil
}

// maxLeaseRetryDelay caps the retry delay suggested while a lease runs.
const maxLeaseRetryDelay = 30 * time.Second

// rebuild answers a retry of a call whose response was too large to record.
func (i *server) rebuild(ctx context.Context, key store.Key, req any, m *method, handler grpc.UnaryHandler, ref []byte) (any, error) {
	switch {
	case m.loader != nil:
		resp, err := m.loader.Load(ctx, ref)
		if err != nil {
			if _, ok := status.FromError(err); ok {
				return nil, err
			}
			return nil, i.internalError(ctx, key, codes.Unavailable, "rebuilding the response failed", err)
		}
		setReplayed(ctx)
		return resp, nil
	case m.rerun:
		return handler(ctx, req)
	}
	return nil, notCached()
}

// setReplayed marks the response as a replay. SetHeader fails only outside
// a gRPC server; the header is a courtesy.
func setReplayed(ctx context.Context) {
	_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
}

// rawMessage returns an empty response whose unknown fields are body, so that
// gRPC's codec sends body as it is.
func rawMessage(m *method, body []byte) proto.Message {
	r := m.output.New()
	r.SetUnknown(body)
	return r.Interface()
}
