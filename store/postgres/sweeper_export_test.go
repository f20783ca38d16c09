package postgres

import "time"

// WithSweepBatchTimeout sets how long a sweeper's batch may take, 30 s
// otherwise, for tests.
func WithSweepBatchTimeout(d time.Duration) SweeperOption {
	return func(o *sweeperOptions) { o.batchTimeout = d }
}
