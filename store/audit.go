package store

import (
	"fmt"
	"time"
)

// AuditAction names the action of an operator that an [AuditEntry]
// records. The values are the same text in every store, the admin service
// and the command line.
type AuditAction string

// The actions an audit trail records.
const (
	// ActionForget is a forget: the key's entry was deleted.
	ActionForget AuditAction = "forget"
	// ActionSettle is a settle: an error was recorded as the outcome of
	// the key's entry in progress.
	ActionSettle AuditAction = "settle"
	// ActionFinish is a finish: an abandoned call was run to its end now.
	ActionFinish AuditAction = "finish"
)

// AuditEntry is what a store's audit trail keeps of one operator's action
// on one key: who did what, when, why, to which key, and what it changed.
type AuditEntry struct {
	// Time is when the action took effect, by the store's clock; the store
	// sets it.
	Time time.Time
	// Scope is the key acted on.
	Scope Scope
	// Action is what was done.
	Action AuditAction
	// Operator names who acted, as the admin service's authorizer named
	// them (its Grant's Subject).
	Operator string
	// Reason is why, as the operator gave it; empty when none was given.
	Reason string
	// Force reports a forced action, which fenced a live lease's holder.
	Force bool
	// Before is the entry's state when the action found it.
	Before State
	// After is the entry's state the action left: "" when the action
	// deleted the entry (a forget).
	After State
	// RequestID is the request id the admin call carried (its
	// x-request-id header), empty when it carried none.
	RequestID string
	// Peer is the network address the admin call came from, empty when
	// the call came on no network (a Server's method called in-process).
	Peer string
}

// Validate reports whether every store can keep e: its Scope keeps the
// rules of [Scope.Validate]; Action is one of the AuditAction constants;
// Before is a State constant and After one or empty; Reason is at most
// [MaxReasonLength] bytes, and Operator, RequestID and Peer at most
// [MaxAuditFieldLength] bytes, each valid UTF-8 without a NUL byte. The
// error wraps [ErrInvalidAudit] (and [ErrInvalidScope] for the scope) and
// names the field and the rule it breaks, never the field's value.
func (e AuditEntry) Validate() error {
	if err := e.Scope.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidAudit, err)
	}
	switch e.Action {
	case ActionForget, ActionSettle, ActionFinish:
	default:
		return fmt.Errorf("%w: action is not an audit action", ErrInvalidAudit)
	}
	if !validState(e.Before) {
		return fmt.Errorf("%w: before is not a key state", ErrInvalidAudit)
	}
	if e.After != "" && !validState(e.After) {
		return fmt.Errorf("%w: after is not a key state", ErrInvalidAudit)
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"reason", e.Reason, MaxReasonLength},
		{"operator", e.Operator, MaxAuditFieldLength},
		{"request id", e.RequestID, MaxAuditFieldLength},
		{"peer", e.Peer, MaxAuditFieldLength},
	} {
		if err := validateFieldAs(ErrInvalidAudit, f.name, f.v, 0, f.max); err != nil {
			return err
		}
	}
	return nil
}

// ValidateReason reports whether reason is one an [AuditEntry] can hold:
// at most [MaxReasonLength] bytes of valid UTF-8 without a NUL byte. The
// error wraps [ErrInvalidAudit] and names the rule it breaks.
func ValidateReason(reason string) error {
	return validateFieldAs(ErrInvalidAudit, "reason", reason, 0, MaxReasonLength)
}

func validState(s State) bool {
	switch s {
	case InProgress, Abandoned, Recorded, Expired:
		return true
	}
	return false
}

// AuditFilter selects the entries [Admin.AuditLog] lists, a page at a
// time. Zero fields select everything.
type AuditFilter struct {
	// Tenant selects one tenant's entries; with AllTenants unset, the
	// empty Tenant is the empty tenant's.
	Tenant string
	// AllTenants selects every tenant's entries; Tenant is then ignored.
	AllTenants bool
	// Method selects the entries of one scope's Method.
	Method string
	// Key, with Method, selects the entries of one key: the scope
	// (Tenant, Method, Key).
	Key string
	// Since and Until bound the entries' times: at or after, and before.
	Since, Until time.Time
	// Limit caps the entries of a page; 0 means 100, and at most 1000.
	Limit int
	// After is the cursor of the page to list: "" for the first page,
	// else the next page's cursor that AuditLog returned for the same
	// filter.
	After string
}

// Validate reports whether every store can select by f: Tenant (unless
// AllTenants is set), Method and Key keep the rules of [Scope.Validate]
// for their fields, where set, and a Key comes with a Method and a
// tenant (not AllTenants). The error wraps [ErrInvalidAudit] and names
// the field and the rule it breaks, never the field's value.
func (f AuditFilter) Validate() error {
	if !f.AllTenants {
		if err := validateFieldAs(ErrInvalidAudit, "tenant filter", f.Tenant, 0, MaxTenantLength); err != nil {
			return err
		}
	}
	if err := validateFieldAs(ErrInvalidAudit, "method filter", f.Method, 0, MaxMethodLength); err != nil {
		return err
	}
	if err := validateFieldAs(ErrInvalidAudit, "key filter", f.Key, 0, MaxKeyLength); err != nil {
		return err
	}
	switch {
	case f.Key != "" && f.Method == "":
		return fmt.Errorf("%w: a key filter needs a method filter", ErrInvalidAudit)
	case f.Key != "" && f.AllTenants:
		return fmt.Errorf("%w: a key filter needs a tenant, not every tenant", ErrInvalidAudit)
	}
	return nil
}

// KeyCount is how many entries of one tenant and method are in one state.
type KeyCount struct {
	Tenant string
	Method string
	State  State
	Count  int64
}

// KeyStats is what [Admin.Stats] counts.
type KeyStats struct {
	// Counts are the counts of every (tenant, method, state) that has
	// entries, ordered by tenant, method and state.
	Counts []KeyCount
	// OldestInProgress is the entry in progress (its lease live) claimed
	// first; nil when there is none.
	OldestInProgress *KeyInfo
	// OldestAbandoned is the abandoned entry claimed first; nil when
	// there is none.
	OldestAbandoned *KeyInfo
}
