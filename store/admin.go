package store

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/internal/record"
)

// Admin is implemented by stores that let an operator see the entries they
// hold and act on one: list them, read everything kept of one, forget one
// (so that its next request runs afresh) and settle one that is stuck in
// progress with an error the operator chooses (so that its retries stop
// waiting and are answered with that error). Callers discover it by a type
// assertion on the [Store].
//
// Each method refuses a scope that fails [Scope.Validate], and Keys a
// filter that fails [KeyFilter.Validate], with an error wrapping
// [ErrInvalidScope], before it touches its storage. An atomic claim still
// running has no entry an operator sees (its Txn has neither recorded nor
// released it): Keys does not list it and Key, Forget and Settle fail with
// ErrNotFound. Each action decides on the entry as it finds it, atomically
// with the rest of the store: an entry whose lease is live is refused with
// a [*LeaseLiveError] unless the action is forced, and a forced action
// fences the lease's holder, whose later writes (Extend, SaveStep, Record),
// every one of them, fail with ErrLeaseLost, also once the scope is claimed
// again.
type Admin interface {
	// Keys returns a page of the entries that match f (expired ones too,
	// while the store holds them), oldest first (by their creation, then in an order of the
	// store's own), at most f.Limit of them, after the cursor f.After. It
	// also returns the cursor of the next page, "" when there is none.
	Keys(ctx context.Context, f KeyFilter) ([]KeyInfo, string, error)

	// Key returns everything kept of s's entry, expired or not. It fails
	// with ErrNotFound when the store holds no entry of s (an expired one
	// it has deleted included).
	Key(ctx context.Context, s Scope) (KeyInfo, error)

	// Forget deletes s's entry, whatever its state: the next request of s
	// runs as if there had been none. It fails with ErrNotFound when there
	// is none, and with a *LeaseLiveError when a lease on s is live and
	// o.Force is false.
	Forget(ctx context.Context, s Scope, o ForgetOptions) error

	// Settle records st, an error, as the outcome of s's entry in
	// progress, encoded as [SettleOutcome] encodes it, so that its
	// retries are answered with st. It ends the entry's lease and drops
	// its steps and what was kept for a finisher; it keeps the entry's
	// expiry and its count of takeovers. It fails with an error wrapping
	// ErrInvalidStatus when SettleOutcome refuses st, with ErrNotFound
	// when s has no entry or its entry has expired, with ErrNotInProgress
	// when its entry is recorded already (forget it instead), and with a
	// *LeaseLiveError when its lease is live and o.Force is false.
	Settle(ctx context.Context, s Scope, st *spb.Status, o SettleOptions) error

	// AddAudit adds e to the store's audit trail, on its own: the entry of
	// an action that went through another path than Forget and Settle (a
	// finisher's run of an abandoned call, whose outcome the call's own
	// transaction records). The store sets e.Time by its clock. It fails
	// with an error wrapping [ErrInvalidAudit] when e breaks the rules of
	// [AuditEntry.Validate], before it touches its storage.
	AddAudit(ctx context.Context, e AuditEntry) error

	// AuditLog returns a page of the audit trail's entries that f selects,
	// oldest first (by their Time, then in an order of the store's own),
	// at most f.Limit of them, after the cursor f.After, and the cursor
	// of the next page ("" when there is none). Entries are kept for the
	// store's audit retention, then swept as expired keys are. A filter
	// that fails [AuditFilter.Validate] fails with its error, and a cursor
	// the store did not make with ErrInvalidCursor.
	AuditLog(ctx context.Context, f AuditFilter) ([]AuditEntry, string, error)

	// Stats counts the entries that f selects by tenant, method and state
	// (f.Limit and f.After are ignored), and returns the oldest of them in
	// progress and the oldest abandoned. A filter that fails
	// [KeyFilter.Validate] fails with its error.
	Stats(ctx context.Context, f KeyFilter) (KeyStats, error)
}

// ForgetOptions are the options of [Admin.Forget].
type ForgetOptions struct {
	// Force forgets an entry whose lease is live, fencing its holder.
	Force bool
	// Audit, when not nil, is added to the audit trail in the same
	// transaction as the forget, and only if the entry is forgotten: the
	// store sets its Time, Scope, Action (ActionForget), Force, Before (the
	// entry's state as the forget found it) and After (""). An entry that
	// breaks [AuditEntry.Validate] fails the Forget with an error wrapping
	// [ErrInvalidAudit], before the store touches its storage.
	Audit *AuditEntry
}

// SettleOptions are the options of [Admin.Settle].
type SettleOptions struct {
	// Force settles an entry whose lease is live, fencing its holder.
	Force bool
	// Audit, when not nil, is added to the audit trail in the same
	// transaction as the settle, and only if the entry is settled, as
	// [ForgetOptions.Audit] is; After is Recorded.
	Audit *AuditEntry
}

// retried are the codes clients are told to retry: ABORTED and
// UNAVAILABLE, which idem's own client recipes retry, RESOURCE_EXHAUSTED,
// which go-grpc-middleware's retry interceptor retries by default, and
// DEADLINE_EXCEEDED, which clients of a method made safe to retry by a key
// retry by design.
var retried = map[code.Code]bool{
	code.Code_ABORTED:            true,
	code.Code_UNAVAILABLE:        true,
	code.Code_RESOURCE_EXHAUSTED: true,
	code.Code_DEADLINE_EXCEEDED:  true,
}

// SettleOutcome returns the outcome that [Admin.Settle] records for st:
// st encoded as idem records a handler's error, which every retry of the
// scope is then answered with. A store outside this module implements
// Settle with it. It refuses, with an error wrapping [ErrInvalidStatus]
// that names the rule, a status whose code is not an error's (1 to 16: a
// response is the method's own to make), one whose code clients retry
// (ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED: a settled
// entry answers every retry the same until it expires, so a client that
// retries the code would spend all its attempts on an answer that never
// changes), and one that cannot be encoded.
func SettleOutcome(st *spb.Status) (Outcome, error) {
	cd := code.Code(st.GetCode())
	switch {
	case cd <= code.Code_OK || cd > code.Code_UNAUTHENTICATED:
		return Outcome{}, fmt.Errorf("%w: status.code must be an error's gRPC code (1 to 16); a response is the method's own to make", ErrInvalidStatus)
	case retried[cd]:
		return Outcome{}, fmt.Errorf("%w: status.code %s is a code clients retry (ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED), "+
			"and a settled key answers every retry the same until it expires; settle with a code they do not retry, such as FAILED_PRECONDITION", ErrInvalidStatus, cd)
	}
	body, _, err := record.Encode(cd, st, nil, nil)
	if err != nil {
		return Outcome{}, fmt.Errorf("%w: the status cannot be encoded: %w", ErrInvalidStatus, err)
	}
	return Outcome{Code: cd, Body: body}, nil
}

// KeyFilter selects the entries [Admin.Keys] lists, a page at a time. Zero
// fields select everything.
type KeyFilter struct {
	// Tenant selects one tenant's entries; with AllTenants unset, the
	// empty Tenant is the empty tenant's.
	Tenant string
	// AllTenants selects every tenant's entries; Tenant is then ignored.
	AllTenants bool
	// Method selects the entries of one scope's Method (a method's full
	// name, or the scope name of its policy).
	Method string
	// States selects the entries in any of these states.
	States []State
	// CreatedAfter and CreatedBefore bound the entries' creation times:
	// created at or after, and before.
	CreatedAfter, CreatedBefore time.Time
	// Limit caps the entries of a page; 0 means 100, and at most 1000.
	Limit int
	// After is the cursor of the page to list: "" for the first page,
	// else the next page's cursor that Keys returned for the same filter.
	// A cursor is the store's own opaque text; one the store did not make
	// fails with ErrInvalidCursor.
	After string
}

// Validate reports whether every store can select by f: Tenant, unless
// AllTenants is set, and Method, unless it is empty, keep the rules of
// [Scope.Validate] for their fields (at most [MaxTenantLength] and
// [MaxMethodLength] bytes of valid UTF-8 without a NUL byte), and States
// holds only the State constants. A filter that breaks them selects no
// entry a store can hold. The error wraps [ErrInvalidScope] and names the
// field and the rule it breaks, never the field's value.
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

// KeyInfo is everything a store keeps of an entry, as [Admin] shows it.
type KeyInfo struct {
	Scope Scope
	// State is the entry's state by the store's clock.
	State       State
	Fingerprint []byte
	CreatedAt   time.Time
	UpdatedAt   time.Time
	ExpiresAt   time.Time
	// LeaseUntil is, for an entry in progress under a lease, when the
	// lease runs out (or ran out: Abandoned); zero otherwise.
	LeaseUntil time.Time
	// Takeovers counts how often the entry was taken over.
	Takeovers int
	// Steps are the steps saved under the entry, in the order they were
	// first saved; nil when there are none.
	Steps []Step
	// Outcome is the recorded outcome; nil unless State is Recorded
	// (or Expired after it was recorded).
	Outcome *Outcome
	// Call is what was kept for a finisher to run the call again; nil
	// when nothing was.
	Call *Call
	// Replays counts the calls answered from the entry's recorded outcome
	// (see [ReplayCounter]), as far as the store has written them: a
	// store that counts in memory shows them once it has flushed them. 0
	// when the store does not count.
	Replays int64
	// LastReplay is when the last counted replay was, by the clock of the
	// server that answered it; zero when none was counted.
	LastReplay time.Time
}

// LeaseLiveError refuses an action on an entry whose lease is live, unless
// forced.
type LeaseLiveError struct {
	// Until is when the lease runs out, by the store's clock.
	Until time.Time
}

func (e *LeaseLiveError) Error() string {
	return fmt.Sprintf("store: the key's lease is live until %s; force the action to fence its holder", e.Until.UTC().Format(time.RFC3339Nano))
}
