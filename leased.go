package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/store"
)

// Errors of idem's that a program tests for with errors.Is.
var (
	// ErrNotLeased is returned by [Step] outside a call in leased mode: an
	// atomic call's writes commit all together or not at all, so it has no
	// steps to resume from.
	ErrNotLeased = errors.New("idem: steps need a call in leased mode")
	// ErrNotFinishable reports, from [Finisher.FinishKey], a call of which
	// nothing was kept for a finisher: its method does not opt in to finish
	// ((idem.v1.method).finish, or [MethodPolicy].Finish).
	ErrNotFinishable = errors.New("idem: nothing was kept to finish the call: its method does not opt in to finish")
)

type leaseCtxKey struct{}

// callLease is the lease of the leased call a handler runs, as its
// context carries it (under leaseCtxKey).
type callLease struct {
	store.Lease
	// d is the lease's length.
	d time.Duration
	// lost ends the handler's context with cause store.ErrLeaseLost.
	lost context.CancelCauseFunc
}

// leaseFrom returns the lease of the leased call handled in ctx.
func leaseFrom(ctx context.Context) (*callLease, bool) {
	l, ok := ctx.Value(leaseCtxKey{}).(*callLease)
	return l, ok
}

// fenced passes err on, and when it is store.ErrLeaseLost it also ends the
// handler's context with it, so that the rest of the handler sees it and
// the call is answered as one whose lease was lost.
func (l *callLease) fenced(err error) error {
	if errors.Is(err, store.ErrLeaseLost) {
		l.lost(store.ErrLeaseLost)
	}
	return err
}

// confirm returns nil when the lease is still the call's, before the step
// name runs, and store.ErrLeaseLost when the handler's context ended with
// that cause (the heartbeat, or an earlier write, found it lost) or the
// store says another request took the key over. It asks the store by
// extending the lease to its full length from now: one round trip, bounded
// as the heartbeat's, on a context detached from the caller's (a leased
// handler runs on after its caller has gone). When the store cannot answer
// it returns that error: the step must not run while its lease is in
// doubt.
func (l *callLease) confirm(ctx context.Context, name string) error {
	if errors.Is(context.Cause(ctx), store.ErrLeaseLost) {
		return store.ErrLeaseLost
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), extendTimeout(l.d))
	defer cancel()
	err := l.Extend(ectx, l.d)
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		return l.fenced(store.ErrLeaseLost)
	case err != nil:
		return fmt.Errorf("idem: checking the lease before step %q: %w", name, err)
	}
	return nil
}

// Step runs fn as the step called name of the leased call handled in ctx,
// once for the call however often it is taken over. On the call's first
// run it runs fn, with a context whose outbound calls carry the step's
// child key ([ChildKey](ctx, name), so that a provider deduplicates a step
// that ran but whose result was lost), saves fn's result under
// name, among the call's steps ([store.Lease.Steps]), and returns it. When
// the call was taken over after an earlier attempt saved the step, a retry
// or a [Finisher], it returns the saved result without running fn. Every
// step's result is kept, not only the last one:
//
//	chargeID, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
//		resp, err := provider.Charge(ctx, req) // carries the step's child key
//		return []byte(resp.GetChargeId()), err
//	})
//
// A call whose lease is lost runs no further step: before fn runs, Step
// returns store.ErrLeaseLost, without running it, when the handler's
// context has ended with that cause (the heartbeat found the lease lost,
// or an earlier write of the call did), and otherwise asks the store
// whether the lease is still the call's, extending it to its full length
// from now: one round trip per step that runs (a saved step costs none),
// besides the one that saves its result. If the store cannot answer, Step
// returns that error and does not run fn either. Once fn has started,
// nothing can take its side effect back: a lease lost while fn runs (the
// handler stalls for longer than the lease, or a failover loses the key's
// row) is noticed only when its result is saved, which then fails with
// store.ErrLeaseLost, and the request that took the call over runs the
// step again. Its calls then carry the same child key, so a service that
// honours idempotency keys answers them with the effect it already made;
// make every side effect of a step idempotent downstream for that reason.
//
// The result is saved on a context detached from the caller's, so that a
// step that ran is kept even after its caller has gone. A name is 1 to
// store.MaxStepLength bytes of UTF-8, a result at most
// store.MaxStepResultBytes, and a call keeps at most
// store.MaxSteps steps of store.MaxStepsBytes in all: a name or a result
// that breaks them is refused with an error wrapping
// store.ErrInvalidStep (for a name, before fn runs). fn's error is
// returned as it is, and nothing is saved. Outside a leased call Step
// returns [ErrNotLeased]. When the lease is lost it returns
// store.ErrLeaseLost and the handler's context ends with that cause: the
// handler should stop, since its outcome will not be recorded.
func Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	l, ok := leaseFrom(ctx)
	if !ok {
		return nil, ErrNotLeased
	}
	if err := (store.Step{Name: name}).Validate(); err != nil {
		return nil, err
	}
	if errors.Is(context.Cause(ctx), store.ErrLeaseLost) {
		return nil, store.ErrLeaseLost
	}
	for _, p := range l.Steps() {
		if p.Name == name {
			return p.Result, nil
		}
	}
	if err := l.confirm(ctx, name); err != nil {
		return nil, err
	}
	data, err := fn(withStep(ctx, name))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseRecordTimeout)
	defer cancel()
	if err := l.SaveStep(sctx, store.Step{Name: name, Result: data}); err != nil {
		return nil, l.fenced(err)
	}
	return data, nil
}
