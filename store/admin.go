package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Admin is implemented by stores that let an operator see the keys they
// hold and act on one: list them, read everything kept of one, forget one
// (so that its next retry runs afresh) and settle one that is stuck in
// progress with an outcome the operator chooses (so that its retries stop
// waiting and replay that outcome). Each action is one statement or one
// transaction, with the fencing of the rest of the store: a key whose lease
// is live is refused with a [*LeaseLiveError] unless the action is forced,
// and a forced action fences the lease's holder, whose later writes
// (extend, save a step, record), every one of them, fail with
// ErrLeaseLost.
type Admin interface {
	// Keys returns the entries that match f, oldest first (by their
	// creation, then by key), at most f.Limit of them, starting after the
	// cursor after ("" for the first page). It also returns the cursor of
	// the next page, "" when there is none. A cursor is the store's own,
	// opaque text; one the store did not make fails with ErrInvalidCursor.
	// A filter that fails [KeyFilter.Validate] fails with its error, which
	// wraps ErrInvalidScope.
	Keys(ctx context.Context, f KeyFilter, after string) ([]KeyInfo, string, error)

	// Key returns everything kept of k. It fails with ErrNotFound when the
	// store holds no entry of k, expired entries included.
	Key(ctx context.Context, k Scope) (KeyInfo, error)

	// Forget deletes k's entry, whatever its state: the next request with
	// k runs as if it never had. It fails with ErrNotFound when there is
	// none, and with a *LeaseLiveError when a lease on k is live and force
	// is false.
	Forget(ctx context.Context, k Scope, force bool) error

	// Settle records out as the outcome of k's entry in progress, ending
	// its lease and dropping what was kept for a finisher, so that its
	// retries replay out. It fails with ErrNotFound when k has no entry,
	// with ErrNotInProgress when its entry is recorded already (forget it
	// instead), and with a *LeaseLiveError when its lease is live and
	// force is false. An expired entry counts as none: ErrNotFound.
	Settle(ctx context.Context, k Scope, out Outcome, force bool) error
}

// KeyFilter selects the entries [Admin.Keys] lists. Zero fields select
// everything.
type KeyFilter struct {
	// Tenant selects one tenant's entries; with AllTenants unset, the
	// empty Tenant is the empty tenant's.
	Tenant string
	// AllTenants selects every tenant's entries; Tenant is then ignored.
	AllTenants bool
	// Method selects the entries of one scope (a method's full name, or
	// its (idem.v1.method).scope).
	Method string
	// States selects the entries in any of these states.
	States []State
	// CreatedAfter and CreatedBefore bound the entries' creation times:
	// created at or after, and before.
	CreatedAfter, CreatedBefore time.Time
	// Limit caps the entries of a page; 0 means 100, and at most 1000.
	Limit int
}

// Validate reports whether every store can select by f: Tenant, unless
// AllTenants is set, and Method, unless it is empty, keep the rules of
// [Scope.Validate] for their fields (at most [MaxTenantLength] and
// [MaxMethodLength] bytes of valid UTF-8 without a NUL byte), and States
// holds only the State constants. A filter that breaks them selects no
// key a store can hold. The error wraps [ErrInvalidScope] and names the
// field and the rule it breaks, never the field's value. Stores check it
// in [Admin.Keys] before they touch their storage.
func (f KeyFilter) Validate() error {
	if !f.AllTenants {
		if err := validateField("tenant filter", f.Tenant, 0, MaxTenantLength); err != nil {
			return err
		}
	}
	if err := validateField("method filter", f.Method, 0, MaxMethodLength); err != nil {
		return err
	}
	for i, st := range f.States {
		switch st {
		case InProgress, Abandoned, Recorded, Expired:
		default:
			return fmt.Errorf("%w: states filter [%d] is not a key state", ErrInvalidScope, i)
		}
	}
	return nil
}

// KeyInfo is everything a store keeps of a key's entry.
type KeyInfo struct {
	Scope       Scope
	State       State
	Fingerprint []byte
	CreatedAt   time.Time
	UpdatedAt   time.Time
	ExpiresAt   time.Time
	// LeaseUntil is, for an entry in progress under a lease, when the
	// lease runs out (or ran out); zero otherwise.
	LeaseUntil time.Time
	// Takeovers counts how often the key was taken over.
	Takeovers int
	// Steps are the steps saved under the key, in order.
	Steps []Step
	// Outcome is the recorded outcome; nil unless State is Recorded
	// (or Expired after it was recorded).
	Outcome *Outcome
	// Call is what was kept for a finisher to run the call again; nil
	// when nothing was.
	Call *Call
}

// ErrNotFound reports a key the store holds no entry of.
var ErrNotFound = errors.New("store: no entry for the key")

// ErrNotInProgress reports a Settle of an entry whose outcome is recorded.
var ErrNotInProgress = errors.New("store: the key's outcome is recorded already")

// ErrInvalidCursor reports a page cursor the store did not make.
var ErrInvalidCursor = errors.New("store: invalid page cursor")

// LeaseLiveError refuses an action on a key whose lease is live, unless
// forced.
type LeaseLiveError struct {
	// Until is when the lease runs out, by the store's clock.
	Until time.Time
}

func (e *LeaseLiveError) Error() string {
	return fmt.Sprintf("store: the key's lease is live until %s; force the action to fence its holder", e.Until.UTC().Format(time.RFC3339Nano))
}
