package idemconnect

import (
	"context"
	"time"
)

// retryOptions are the options of [NewRetryInterceptor].
type retryOptions struct {
	maxAttempts uint
	backoff     func(ctx context.Context, attempt uint) time.Duration
	sleep       func(ctx context.Context, d time.Duration) error // tests set it
}

func evaluateRetryOptions(opts []RetryOption) *retryOptions {
	o := &retryOptions{
		maxAttempts: 5,
		backoff:     backoffExponential(50 * time.Millisecond),
		sleep:       sleep,
	}
	for _, opt := range opts {
		opt.applyRetry(o)
	}
	return o
}

// A RetryOption configures the retries of [NewRetryInterceptor].
type RetryOption interface {
	applyRetry(*retryOptions)
}

type retryOptionFunc func(*retryOptions)

func (f retryOptionFunc) applyRetry(o *retryOptions) { f(o) }

// WithMaxAttempts sets how many times a call is sent at most, the first
// attempt included; below 1, it counts as 1: the call is sent once and
// never retried. Default: 5.
func WithMaxAttempts(n int) RetryOption {
	return retryOptionFunc(func(o *retryOptions) { o.maxAttempts = uint(max(n, 1)) })
}

// WithBackoff sets how long to wait before retrying an answer that carries
// no google.rpc.RetryInfo (an UNAVAILABLE from a proxy or a lost
// connection, say): backoff(ctx, n) before the n-th retry, n counting from
// 1, with the call's context; the signature of go-grpc-middleware's
// retry.BackoffFunc. A negative delay counts as 0, and nil retries at
// once. An answer with a RetryInfo is retried after the delay it asks for,
// whatever backoff says. Default: 50 ms before the first retry, doubling
// before each next one (50, 100, 200, 400 ms).
func WithBackoff(backoff func(ctx context.Context, attempt uint) time.Duration) RetryOption {
	return retryOptionFunc(func(o *retryOptions) { o.backoff = backoff })
}

// backoffExponential returns a backoff of base before the first retry,
// doubling before each next one.
func backoffExponential(base time.Duration) func(context.Context, uint) time.Duration {
	return func(_ context.Context, attempt uint) time.Duration {
		return base << min(max(attempt, 1)-1, 30) // 30: far past any deadline, short of overflow
	}
}
