package store

import "errors"

// The errors of a store, which every store returns for the situations they
// name (wrapped, where a message adds to them: test with errors.Is).
var (
	// ErrInvalidScope reports a [Scope] that breaks the rules of
	// [Scope.Validate], so that no store can hold it, or a [KeyFilter] that
	// breaks those of [KeyFilter.Validate]. Nothing was written or read; the
	// same scope fails the same way again, so retrying does not help.
	ErrInvalidScope = errors.New("store: invalid scope")

	// ErrInUse reports that another request holds the scope and the bounded
	// wait for it ran out. Nothing was changed; the caller should retry later.
	ErrInUse = errors.New("store: idempotency key in use by a request in flight")

	// ErrConflict reports a transient conflict between concurrent transactions
	// (a serialization failure or a deadlock), or an optimistic claim whose
	// record found the scope taken ([ClaimRequest].Optimistic). Nothing was
	// recorded; the whole call can be retried.
	ErrConflict = errors.New("store: transaction conflict")

	// ErrLeaseLost reports a write under a leased claim that is no longer this
	// request's: its lease ran out and a retry took the scope over (or the
	// entry expired), an operator forgot or settled the scope by force
	// ([Admin]), or the entry is gone, as after a failover to a standby that
	// had not received it. The write changed nothing: the request's outcome
	// was not recorded and must not be; the new holder's (or the operator's)
	// stands. A write after the lease's own Record or Release fails with it
	// too: the lease has ended.
	ErrLeaseLost = errors.New("store: lease lost to another request")

	// ErrCorrupt reports an entry whose stored state cannot be read back: for
	// a leased claim, its saved steps, damaged outside idem (a manual edit, a
	// faulty restore). A store returns it only for data it read and could not
	// decode, never for a failure to reach or query its storage. The entry's
	// steps may have run, so no request may run them again: every claim of the
	// scope fails with ErrCorrupt, and retrying does not help, until an
	// operator has checked its side effects and forgotten the scope (or it
	// expires).
	ErrCorrupt = errors.New("store: the key's stored state is unreadable")

	// ErrNotReady reports a store that cannot claim until an operator acts:
	// for PostgreSQL, idem's schema is missing or older than the store needs
	// (apply it with postgres.Migrate). Nothing was changed, and retrying does
	// not help until the store is set up.
	ErrNotReady = errors.New("store: not set up")

	// ErrInvalidStep reports a step that [Lease.SaveStep] refuses: it breaks
	// the rules of [Step.Validate], or would make the entry's steps exceed
	// their bounds. Nothing was saved; saving the same step again fails again.
	ErrInvalidStep = errors.New("store: invalid step")

	// ErrNotFound reports a scope the store holds no entry of.
	ErrNotFound = errors.New("store: no entry for the key")

	// ErrNotInProgress reports a Settle of an entry whose outcome is recorded.
	ErrNotInProgress = errors.New("store: the key's outcome is recorded already")

	// ErrInvalidStatus reports a status that [Admin.Settle] refuses to record
	// (see [SettleOutcome]). Nothing was changed; the same status fails the
	// same way again.
	ErrInvalidStatus = errors.New("store: invalid status")

	// ErrInvalidCursor reports a page cursor the store did not make.
	ErrInvalidCursor = errors.New("store: invalid page cursor")

	// ErrInvalidAudit reports an [AuditEntry] or an [AuditFilter] that
	// breaks the rules of its Validate method. Nothing was written or
	// read; the same entry fails the same way again.
	ErrInvalidAudit = errors.New("store: invalid audit entry")
)
