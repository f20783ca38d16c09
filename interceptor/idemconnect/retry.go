package idemconnect

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/retryhint"
)

// NewRetryInterceptor returns a client interceptor that retries a unary
// call answered ABORTED or UNAVAILABLE, as idem answers a request whose key
// is still in flight, a lease taken over, or a store that failed, each
// having recorded nothing: it sends the same request again, with the same
// idempotency key, so that the call runs once and every attempt gets its
// one outcome. It waits before each retry as long as the answer's
// google.rpc.RetryInfo asks ([RetryDelay]), or as [WithBackoff] says when
// there is none, and sends the call at most [WithMaxAttempts] times (5).
//
// Any other answer is the call's, returned at once: a success, a replay, a
// key reused with another request (FAILED_PRECONDITION, reason
// IDEMPOTENCY_KEY_REUSED), a malformed or missing key (INVALID_ARGUMENT), a
// handler's own error, and a recorded error replayed (marked
// Idempotent-Replayed: true), whatever its code, since every retry would
// get it again. These are the codes the gRPC recipe's retry interceptor
// retries (package interceptor).
//
// The call's context bounds the retries: when it ends during a wait, or
// when its deadline would pass before the next attempt could start, the
// interceptor returns the last attempt's answer.
//
// Place it after [NewClientInterceptor], which attaches the key once per
// logical call, so that every attempt carries that key, in the header and
// in the request's key field:
//
//	connect.WithInterceptors(
//		idemconnect.NewClientInterceptor(),
//		idemconnect.NewRetryInterceptor(),
//	)
//
// Placed before it instead, it still sends one key: the client interceptor
// attaches on each attempt the key it chose for the first. Each call
// should be safe to repeat: keyed by idem, or of a method marked
// NO_SIDE_EFFECTS or IDEMPOTENT; a call without a key answered UNAVAILABLE
// is retried too, as grpc-go's retry interceptors do.
//
// Each attempt after the first carries its number in the header
// Idempotency-Attempt ([idem.HTTPAttemptHeader]): 2, 3 and so on, so that
// a method in idem.ModeAuto claims it reading first, as a retry of a
// recorded call is best claimed. The first attempt goes as the caller and
// the interceptors after this one make it: [NewClientInterceptor] marks
// it 1 when it made the call's key.
//
// Streaming calls are not retried: their messages are sent and received as
// the stream goes, and idem keys unary calls only. Used on a handler, it
// does nothing.
func NewRetryInterceptor(opts ...RetryOption) connect.Interceptor {
	return &retryInterceptor{opts: evaluateRetryOptions(opts)}
}

type retryInterceptor struct {
	opts *retryOptions
}

func (r *retryInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx = context.WithValue(ctx, pinCtxKey{}, &pin{req: req})
		h := req.Header()
		marked := slices.Clone(h.Values(idem.HTTPAttemptHeader))
		defer func() {
			h.Del(idem.HTTPAttemptHeader)
			for _, v := range marked {
				h.Add(idem.HTTPAttemptHeader, v)
			}
		}()
		for attempt := uint(1); ; attempt++ {
			if attempt > 1 {
				h.Set(idem.HTTPAttemptHeader, strconv.FormatUint(uint64(attempt), 10))
			}
			resp, err := next(ctx, req)
			if err == nil || attempt >= r.opts.maxAttempts || !retryable(err) {
				return resp, err
			}
			d, ok := RetryDelay(err)
			if !ok && r.opts.backoff != nil {
				d = max(r.opts.backoff(ctx, attempt), 0)
			}
			if deadline, ok := ctx.Deadline(); ok && !time.Now().Add(d).Before(deadline) {
				return resp, err
			}
			if r.opts.sleep(ctx, d) != nil {
				return resp, err
			}
		}
	}
}

func (r *retryInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (r *retryInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// retryable reports whether err, an attempt's answer, is retried with the
// same key.
func retryable(err error) bool {
	var ce *connect.Error
	replayed := errors.As(err, &ce) && ce.Meta().Get(idem.HTTPReplayedHeader) == "true"
	return retryhint.Retryable(code.Code(connect.CodeOf(err)), replayed)
}

// RetryDelay returns the delay a server suggested in the
// google.rpc.RetryInfo detail of err, a *connect.Error, as idem's handler
// interceptor does when a request's key is held by a request still in
// flight (ABORTED, reason IDEMPOTENCY_KEY_IN_USE) or its store failed
// (UNAVAILABLE); it reports false when err carries no RetryInfo. It reads
// the detail as interceptor.RetryDelay does for grpc-go, on each of
// Connect's protocols, without building grpc-go.
func RetryDelay(err error) (time.Duration, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return 0, false
	}
	return retryhint.Delay(statusOf(ce))
}

// sleep waits for d, or until ctx ends, and then returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

type pinCtxKey struct{}

// pin keeps the keys of one logical call, for a [NewClientInterceptor]
// placed after the [NewRetryInterceptor] that made it: the first attempt
// records what the client interceptor sent, and the next ones send it
// again. It serves req alone, so that a call made from inside the chain
// with the call's context is another logical call. The attempts of one
// call run one after another, so it needs no lock.
type pin struct {
	req   connect.AnyRequest
	set   bool
	send  any      // the message sent
	keys  []string // the keys sent
	first bool     // the keys are the call's first (OutgoingKeys.For)
}
