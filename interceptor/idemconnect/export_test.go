package idemconnect

import (
	"context"
	"time"
)

// WithSleep makes the retry interceptor wait with sleep instead of a
// timer, so that tests see the delays it asks for without waiting them.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) RetryOption {
	return retryOptionFunc(func(o *retryOptions) { o.sleep = sleep })
}
