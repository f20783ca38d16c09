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
// "charge_sent", "charge_confirmed"; only the last one is kept. A step name
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
