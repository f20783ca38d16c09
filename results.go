package idem

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Result is how idem ended a call: every call the engine handles ends in
// exactly one. It is the attribute idem.result of idem's metrics and
// spans, and [Report].Result.
type Result string

// The results of a call.
const (
	// ResultExecuted: the handler ran under the key and its outcome (a
	// response or a deterministic error) was recorded.
	ResultExecuted Result = "executed"
	// ResultReplayed: a recorded outcome was replayed.
	ResultReplayed Result = "replayed"
	// ResultInUse: the key is held by a call still running (ABORTED).
	ResultInUse Result = "in_use"
	// ResultReused: the key came with another request (FAILED_PRECONDITION).
	ResultReused Result = "reused"
	// ResultInvalidKey: the key, or the scope it would be kept under, was
	// refused (INVALID_ARGUMENT), or the tenant could not be resolved.
	ResultInvalidKey Result = "invalid_key"
	// ResultMissingKey: a method that requires a key got none.
	ResultMissingKey Result = "missing_key"
	// ResultPassthrough: idem stood aside: no key where none is required,
	// or a method without side effects.
	ResultPassthrough Result = "passthrough"
	// ResultNotCached: the recorded response was too large to keep and
	// cannot be rebuilt nor rerun (FAILED_PRECONDITION).
	ResultNotCached Result = "not_cached"
	// ResultRebuilt: a response too large to keep was rebuilt by the
	// method's Loader.
	ResultRebuilt Result = "rebuilt"
	// ResultRerun: a response too large to keep was produced again by the
	// handler, as the method allows.
	ResultRerun Result = "rerun"
	// ResultLeaseLost: a leased call ran past its lease and a retry took
	// the key over; its outcome was not recorded.
	ResultLeaseLost Result = "lease_lost"
	// ResultStoreError: the store failed (or the outcome could not be
	// encoded for it); the client was told to retry, or, for a store that
	// is not set up or a record that cannot be read, that idem failed.
	ResultStoreError Result = "store_error"
	// ResultTransient: the handler failed with an error that is not
	// deterministic, and the key was released for a retry.
	ResultTransient Result = "transient"
	// ResultNotFinished: a Finisher gave up on an abandoned call and
	// recorded it as failed (FAILED_PRECONDITION, reason
	// IDEMPOTENCY_NOT_FINISHED).
	ResultNotFinished Result = "not_finished"
	// ResultUnreadable: a Finisher could not read what was kept of an
	// abandoned call (its row is damaged, or its request is not a request
	// of its method), so the call cannot be run again; it was recorded as
	// failed (FAILED_PRECONDITION, reason IDEMPOTENCY_NOT_FINISHED) and the
	// problem logged at ERROR.
	ResultUnreadable Result = "unreadable"
)

// Mode is how a method's key is held while its handler runs.
type Mode string

// The modes of a method.
const (
	// ModeAtomic holds the key in the transaction of the handler's writes.
	ModeAtomic Mode = "atomic"
	// ModeLeased holds the key with a lease, committed before the handler
	// runs.
	ModeLeased Mode = "leased"
	// ModeOptimistic runs the handler in a transaction as ModeAtomic does,
	// but reads the key only when recording the outcome.
	ModeOptimistic Mode = "optimistic"
	// ModeAuto chooses per call: a call its client marks as a first
	// attempt ([AttemptHeader] 1) is claimed as in ModeOptimistic, any
	// other as in ModeAtomic. The mark costs or saves time only; the
	// outcome is the same either way.
	ModeAuto Mode = "auto"
)

// Report describes how one call went, for [WithReportHook]. It never
// holds the key, the tenant or the request.
type Report struct {
	// Method is the call's full method name.
	Method string
	// Mode is the method's mode.
	Mode Mode
	// Result is how idem ended the call.
	Result Result
	// Replayed reports that the answer was a recorded one (replayed, or
	// rebuilt by a Loader), not the handler's.
	Replayed bool
	// ClaimDuration is how long claiming the key took, waits included;
	// zero when the call claimed nothing.
	ClaimDuration time.Duration
	// RecordDuration is how long recording the outcome took; zero when
	// nothing was recorded.
	RecordDuration time.Duration
	// Duration is how long the whole call took in idem, handler included.
	Duration time.Duration
	// Finishing reports that a [Finisher] ran the call, its caller gone.
	Finishing bool
	// Optimistic reports that the call claimed its key reading nothing
	// before the handler ran: every claim in [ModeOptimistic], and in
	// [ModeAuto] the claim of a call its client marked as a first attempt
	// ([AttemptHeader]). Where the key turned out taken, the call then
	// claimed it again as [ModeAtomic] does, and Result says how that
	// ended. False for a call that claimed nothing.
	Optimistic bool
}

// WithReportHook sets a function called once per call the engine handles,
// when idem has ended it, with how it went: to count replays in business
// metrics, say. It runs on the call's goroutine, after the answer is
// decided and before it is sent, so keep it quick. A hook that panics does
// not change the call's answer; the panic is logged. Default: none.
func WithReportHook(hook func(ctx context.Context, r Report)) Option {
	return optionFunc(func(o *options) { o.hook = hook })
}

// report reports how c ended: in the metrics, on the call's span, and to
// the hook.
func (e *Engine) report(ctx context.Context, c *callState) {
	e.obs.observe(ctx, c)
	hook := e.opts.hook
	if hook == nil {
		return
	}
	r := Report{
		Method:         c.method,
		Mode:           c.mode,
		Result:         c.result,
		Replayed:       c.replayed,
		ClaimDuration:  c.claim,
		RecordDuration: c.record,
		Duration:       time.Since(c.started),
		Finishing:      c.finishing,
		Optimistic:     c.readNothing,
	}
	defer func() {
		if p := recover(); p != nil {
			e.log(ctx, slog.LevelError, "idem: the report hook panicked", c.key, fmt.Errorf("%v", p))
		}
	}()
	hook(ctx, r)
}
