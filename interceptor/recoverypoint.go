package interceptor

import (
	"context"
	"errors"

	"github.com/idemkit/idem/store"
)

// ErrNotLeased is returned by [SaveRecoveryPoint] outside a call in leased
// mode: an atomic call's writes commit all together or not at all, so it
// has no steps to resume from.
var ErrNotLeased = errors.New("idem: recovery points need a call in leased mode")

type leaseCtxKey struct{}

// SaveRecoveryPoint records that the leased call handled in ctx reached step,
// with a small payload to resume from (a provider's charge id, say). It is
// durable when SaveRecoveryPoint returns, so a retry that takes the key over
// after a crash finds it with [LastRecoveryPoint] and resumes there instead
// of starting again.
//
// Name steps in the order the handler reaches them, e.g. "created",
// "charge_sent", "charge_confirmed"; [LastRecoveryPoint] returns the last
// one, and every step is kept among the call's steps (see [Step], which
// runs and saves a step in one go). A step name
// is 1 to store.MaxStepLength (255) bytes of valid UTF-8 without control
// characters, and data at most store.MaxRecoveryDataBytes (64 KiB).
//
// It returns [ErrNotLeased] outside a leased call; an error wrapping
// store.ErrInvalidRecoveryPoint, naming the rule, for a step or data that
// breaks it (nothing is saved); and store.ErrLeaseLost when a retry has
// taken the key over (the handler should stop: its outcome will not be
// recorded).
func SaveRecoveryPoint(ctx context.Context, step string, data []byte) error {
	l, ok := ctx.Value(leaseCtxKey{}).(store.Lease)
	if !ok {
		return ErrNotLeased
	}
	p := store.RecoveryPoint{Step: step, Data: data}
	if err := p.Validate(); err != nil {
		return err
	}
	return l.SaveRecoveryPoint(ctx, p)
}

// LastRecoveryPoint returns the last recovery point saved for the key of the
// leased call handled in ctx: by this call, or by an earlier attempt whose
// lease this call took over. It reports false when there is none, or
// outside a leased call.
func LastRecoveryPoint(ctx context.Context) (step string, data []byte, ok bool) {
	l, ok := ctx.Value(leaseCtxKey{}).(store.Lease)
	if !ok {
		return "", nil, false
	}
	p, ok := l.RecoveryPoint()
	return p.Step, p.Data, ok
}

// Step runs fn as the step called name of the leased call handled in ctx,
// once for the call however often it is taken over. On the call's first
// run it runs fn, with a context whose outbound calls carry the step's
// child key ([ContextWithStep], so that a provider deduplicates a step that
// ran but whose result was lost), saves fn's result as the recovery point
// name, among the call's steps ([store.Lease.Steps]), and returns it. When
// the call was taken over after an earlier attempt saved the step, a retry
// or a [Completer], it returns the saved result without running fn. Every
// step's result is kept, not only the last one:
//
//	chargeID, err := interceptor.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
//		resp, err := provider.Charge(ctx, req) // carries the step's child key
//		return []byte(resp.GetChargeId()), err
//	})
//
// The result is saved on a context detached from the caller's, so that a
// step that ran is kept even after its caller has gone. Names and results
// follow the rules of [SaveRecoveryPoint], and a call keeps at most
// store.MaxSteps steps of store.MaxStepsBytes in all: a name or a result
// that breaks them is refused with an error wrapping
// store.ErrInvalidRecoveryPoint (for a name, before fn runs). fn's error is
// returned as it is, and nothing is saved. Outside a leased call Step
// returns [ErrNotLeased]; when a retry took the key over, store.ErrLeaseLost.
func Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	l, ok := ctx.Value(leaseCtxKey{}).(store.Lease)
	if !ok {
		return nil, ErrNotLeased
	}
	if err := (store.RecoveryPoint{Step: name}).Validate(); err != nil {
		return nil, err
	}
	for _, p := range l.Steps() {
		if p.Step == name {
			return p.Data, nil
		}
	}
	data, err := fn(ContextWithStep(ctx, name))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseRecordTimeout)
	defer cancel()
	if err := l.SaveRecoveryPoint(sctx, store.RecoveryPoint{Step: name, Data: data}); err != nil {
		return nil, err
	}
	return data, nil
}
