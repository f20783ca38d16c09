package interceptor

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/internal/retryhint"
)

// RetryDelay returns the delay a server suggested in the
// google.rpc.RetryInfo detail of err, as idem's server interceptor does
// when a request's key is held by a request still in flight (ABORTED,
// reason IDEMPOTENCY_KEY_IN_USE). It reports false when err carries no
// RetryInfo.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return 0, false
	}
	return retryhint.Delay(st.Proto())
}

// BackoffRetryInfo returns a backoff function for go-grpc-middleware's
// retry interceptor (retry.WithBackoff) that waits as long as the previous
// attempt's RetryInfo asked, and for fallback(ctx, attempt) when it carried
// none. The retry interceptor hands its backoff function no error, so this
// one reads the attempts' outcomes from the context that
// [UnaryClientInterceptor] prepares: put the idem interceptor before the
// retry interceptor in the chain (the order the package documentation
// gives). Elsewhere it always uses fallback.
//
// grpc-go's own retryPolicy does not read RetryInfo; it honours the
// grpc-retry-pushback-ms trailer instead.
func BackoffRetryInfo(fallback func(ctx context.Context, attempt uint) time.Duration) func(ctx context.Context, attempt uint) time.Duration {
	return func(ctx context.Context, attempt uint) time.Duration {
		if a, ok := ctx.Value(attemptsCtxKey{}).(*attempts); ok {
			if d, ok := RetryDelay(a.lastErr()); ok {
				return d
			}
		}
		if fallback == nil {
			return 0
		}
		return fallback(ctx, attempt)
	}
}

type attemptsCtxKey struct{}

// attempts records the outcome of the latest attempt of one logical call.
type attempts struct {
	mu   sync.Mutex
	last error
}

func (a *attempts) finish(err error) {
	a.mu.Lock()
	a.last = err
	a.mu.Unlock()
}

func (a *attempts) lastErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// trackAttempts returns ctx and opts set up so that every attempt made
// below with them records its outcome where [BackoffRetryInfo] finds it.
func trackAttempts(ctx context.Context, opts []grpc.CallOption) (context.Context, []grpc.CallOption) {
	a := &attempts{}
	return context.WithValue(ctx, attemptsCtxKey{}, a),
		append(opts[:len(opts):len(opts)], grpc.OnFinish(a.finish))
}
