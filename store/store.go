package store

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
)

// ErrInUse reports that another request holds the key and the bounded wait
// for it ran out. The caller should retry later; the key is not lost.
var ErrInUse = errors.New("store: idempotency key in use by a request in flight")

// ErrConflict reports a transient conflict between concurrent transactions
// (a serialization failure or a deadlock). Nothing was recorded; the whole
// call can be retried.
var ErrConflict = errors.New("store: transaction conflict")

// Key identifies one logical operation. Two claims collide only when all
// three fields are equal.
type Key struct {
	// Tenant is the caller's scope, derived from its identity.
	Tenant string
	// Method is the full gRPC method name, "/package.Service/Method".
	Method string
	// Key is the client's idempotency key.
	Key string
}

// State is the state of an entry another request created.
type State int

const (
	// Completed entries hold a recorded outcome that can be replayed.
	Completed State = iota + 1
	// InProgress entries belong to a request still running.
	InProgress
)

// Entry is what a claim found when the key was already taken.
type Entry struct {
	// State tells whether the outcome is recorded yet.
	State State
	// Fingerprint is the fingerprint of the request that took the key.
	Fingerprint []byte
	// Outcome is the recorded outcome; it is set when State is Completed.
	Outcome Outcome
	// ExpiresAt is when the entry stops counting.
	ExpiresAt time.Time
}

// Outcome is the result of a call, as recorded and replayed.
type Outcome struct {
	// Code is the gRPC status code of the call.
	Code codes.Code
	// Body is the serialized response message when Code is OK, and the
	// serialized google.rpc.Status otherwise.
	Body []byte
}

// Claim is the result of [Store.Claim]: exactly one of Txn and Entry is set.
type Claim struct {
	// Txn is set when the caller now owns the key.
	Txn Txn
	// Entry is set when the key was already taken by another request.
	Entry *Entry
}

// Store claims idempotency keys and records outcomes.
type Store interface {
	// Claim takes key for a request with the given fingerprint, or reports
	// who has it. It returns a Claim with Txn set when the key was free (or
	// its entry had expired), a Claim with Entry set when another request
	// completed it or is running it, and ErrInUse when the wait for a
	// concurrent owner ran out.
	Claim(ctx context.Context, key Key, fingerprint []byte) (Claim, error)
}

// Txn is an owned claim. Exactly one of Complete and Release takes effect;
// Release after Complete does nothing, so it can be deferred.
type Txn interface {
	// Context returns a context derived from parent that carries what the
	// handler needs to join the claim (for PostgreSQL, the transaction that
	// holds it).
	Context(parent context.Context) context.Context

	// Complete records out and makes the claim durable together with the
	// handler's writes. When out.Code is not OK, the handler's writes are
	// discarded and only the outcome is kept. On error nothing was recorded,
	// unless the error leaves the commit's result unknown; either way a
	// retry is safe.
	Complete(ctx context.Context, out Outcome) error

	// Release discards the claim and the handler's writes, so that a retry
	// runs afresh.
	Release(ctx context.Context) error
}
