package idem

import (
	"fmt"
	"time"
)

// Defaults of the finisher's options.
const (
	defaultFinishInterval       = 10 * time.Second
	defaultFinishGrace          = 30 * time.Second
	defaultFinishBatchSize      = 100
	defaultFinishMaxAttempts    = 8
	defaultFinishAttemptTimeout = time.Minute
)

// A FinisherOption configures a [Finisher].
type FinisherOption interface {
	applyFinisher(*finisherOptions)
}

type finisherOptions struct {
	interval       time.Duration
	grace          time.Duration
	batchSize      int
	maxAttempts    int
	attemptTimeout time.Duration

	errs []error // of options given values they do not take
}

type finisherOptionFunc func(*finisherOptions)

func (f finisherOptionFunc) applyFinisher(o *finisherOptions) { f(o) }

// WithInterval sets how long [Finisher.Run] waits between passes. It also
// bounds how long a pass waits for the store's list of abandoned calls; a
// store of several databases (postgres.NewSharded) asks them all at once,
// so it bounds each of them. d must be positive. Default: 10 s.
func WithInterval(d time.Duration) FinisherOption {
	return finisherOptionFunc(func(o *finisherOptions) {
		if d <= 0 {
			o.errs = append(o.errs, fmt.Errorf("idem: WithInterval(%v): the interval must be positive", d))
		}
		o.interval = d
	})
}

// WithGrace sets how long after a lease ran out a call counts as
// abandoned, for its own retry to take it over first; it doubles after each
// attempt to finish the call that failed. Zero means none: a call counts as
// abandoned as soon as its lease ran out, and failed attempts add no wait.
// d must not be negative. Default: 30 s.
func WithGrace(d time.Duration) FinisherOption {
	return finisherOptionFunc(func(o *finisherOptions) {
		if d < 0 {
			o.errs = append(o.errs, fmt.Errorf("idem: WithGrace(%v): the grace must not be negative (zero is none)", d))
		}
		o.grace = d
	})
}

// WithBatchSize sets how many calls a pass takes on at most. n must be
// positive. Default: 100.
func WithBatchSize(n int) FinisherOption {
	return finisherOptionFunc(func(o *finisherOptions) {
		if n <= 0 {
			o.errs = append(o.errs, fmt.Errorf("idem: WithBatchSize(%d): the batch size must be positive", n))
		}
		o.batchSize = n
	})
}

// WithMaxAttempts sets after how many takeovers of a call (by retries or
// finishers) a finisher gives up on it and records it as failed. n must be
// positive. Default: 8.
func WithMaxAttempts(n int) FinisherOption {
	return finisherOptionFunc(func(o *finisherOptions) {
		if n <= 0 {
			o.errs = append(o.errs, fmt.Errorf("idem: WithMaxAttempts(%d): the number of attempts must be positive", n))
		}
		o.maxAttempts = n
	})
}

// WithAttemptTimeout bounds each attempt to finish one call: its context's
// deadline, for the handler and idem's store calls. d must be positive.
// Default: 1 min.
func WithAttemptTimeout(d time.Duration) FinisherOption {
	return finisherOptionFunc(func(o *finisherOptions) {
		if d <= 0 {
			o.errs = append(o.errs, fmt.Errorf("idem: WithAttemptTimeout(%v): the attempt timeout must be positive", d))
		}
		o.attemptTimeout = d
	})
}
