package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/code"
)

// ErrInUse reports that another request holds the key and the bounded wait
// for it ran out. The caller should retry later; the key is not lost.
var ErrInUse = errors.New("store: idempotency key in use by a request in flight")

// ErrConflict reports a transient conflict between concurrent transactions
// (a serialization failure or a deadlock). Nothing was recorded; the whole
// call can be retried.
var ErrConflict = errors.New("store: transaction conflict")

// ErrLeaseLost reports a write under a leased claim that is no longer this
// request's: its lease ran out and a retry took the key over (or the key
// expired), an operator forgot or settled the key by force ([Admin]), or
// the key's row is gone, as after a failover to a standby that had not
// received it. The write changed nothing: the request's outcome was not
// recorded and must not be; the new owner's (or the operator's) stands. A
// write after the lease's own Record or Release fails with it too: the
// lease has ended.
var ErrLeaseLost = errors.New("store: lease lost to another request")

// ErrNotReady reports a store that cannot claim keys until an operator
// acts: for PostgreSQL, idem's schema is missing or older than the store
// needs (apply it with postgres.Migrate). Nothing was changed, and retrying
// does not help until the store is set up.
var ErrNotReady = errors.New("store: not set up")

// ErrInvalidScope reports that a [Scope] breaks the rules of [Scope.Validate], so
// no store can hold it, or a [KeyFilter] those of [KeyFilter.Validate].
// Nothing was written or read; the same key fails the same way again, so
// retrying does not help.
var ErrInvalidScope = errors.New("store: invalid scope")

// The longest fields of a [Scope], in bytes. Together they stay well within
// what a PostgreSQL B-tree index entry can hold.
const (
	MaxTenantLength = 255
	MaxMethodLength = 1024
	MaxKeyLength    = 255
)

// Scope identifies one logical operation. Two claims collide only when all
// three fields are equal. [Scope.Validate] states the rules every store
// enforces on the fields.
type Scope struct {
	// Tenant is the caller's scope, derived from its identity.
	Tenant string
	// Method is the full gRPC method name, "/package.Service/Method".
	Method string
	// Key is the client's idempotency key.
	Key string
}

// Validate reports whether every store can hold k: Tenant is 0 to
// [MaxTenantLength] bytes, Method 1 to [MaxMethodLength] bytes and Key 1 to
// [MaxKeyLength] bytes, each valid UTF-8 without a NUL byte. The error wraps
// [ErrInvalidScope] and names the field and the rule it breaks, never the
// field's value. Stores check it in Claim and ClaimLeased before they touch
// their storage.
func (k Scope) Validate() error {
	if err := validateField("tenant", k.Tenant, 0, MaxTenantLength); err != nil {
		return err
	}
	if err := validateField("method", k.Method, 1, MaxMethodLength); err != nil {
		return err
	}
	return validateField("key", k.Key, 1, MaxKeyLength)
}

func validateField(name, v string, minLen, maxLen int) error {
	switch {
	case len(v) < minLen:
		return fmt.Errorf("%w: %s is empty", ErrInvalidScope, name)
	case len(v) > maxLen:
		return fmt.Errorf("%w: %s is %d bytes, longer than the %d allowed", ErrInvalidScope, name, len(v), maxLen)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidScope, name)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalidScope, name)
	}
	return nil
}

// State is the state of a key's entry. A claim that finds the key taken
// reports its entry as InProgress or Recorded ([Entry]); an operator also
// sees Abandoned and Expired ([Admin]). The values are the same text in
// every store, its API, the admin service and the command line.
type State string

// The states of a key's entry.
const (
	// InProgress is an entry whose request is still running: an atomic
	// claim's transaction, or a leased claim whose lease is live.
	InProgress State = "in_progress"
	// Abandoned is a leased claim's entry whose lease ran out before its
	// outcome was recorded: its caller is gone, and a retry with the same
	// fingerprint, or a finisher, may take it over. A claim reports it as
	// InProgress.
	Abandoned State = "abandoned"
	// Recorded is an entry whose outcome is recorded: later claims replay
	// it.
	Recorded State = "recorded"
	// Expired is an entry past its expiry, which counts as absent: a
	// claim never reports it, and a store deletes it in its own time.
	Expired State = "expired"
)

// Entry is what a claim found when the key was already taken.
type Entry struct {
	// State tells whether the outcome is recorded yet.
	State State
	// Fingerprint is the fingerprint of the request that took the key.
	Fingerprint []byte
	// Outcome is the recorded outcome; it is set when State is Recorded.
	Outcome Outcome
	// ExpiresAt is when the entry stops counting.
	ExpiresAt time.Time
	// LeaseRemaining is, for an in-progress entry held by a leased claim,
	// how long its lease still runs (by the store's clock); zero otherwise.
	LeaseRemaining time.Duration
}

// Outcome is the result of a call, as recorded and replayed.
type Outcome struct {
	// Code is the status code of the call (google.rpc.Code, which gRPC and
	// Connect share).
	Code code.Code
	// Body is the serialized response message when Code is OK, and the
	// serialized google.rpc.Status otherwise. When NotCached is set it holds
	// a reference to the response instead.
	Body []byte
	// NotCached marks an OK outcome whose response was too large to keep:
	// Body is a small reference (the created row's id, say) from which the
	// response can be rebuilt, possibly empty.
	NotCached bool
}

// Request is what a claim keeps of the call besides its key.
type Request struct {
	// Fingerprint is the request's fingerprint: a retry must come with the
	// same one to be answered with the key's outcome.
	Fingerprint []byte
	// TTL is how long the key is kept once claimed: past it the key counts
	// as absent. Zero selects the store's default.
	TTL time.Duration

	// Optimistic lets Claim read nothing before the handler runs: the key is
	// not looked at until Txn.Record, which writes its entry where there is
	// none and may fail with ErrConflict where there is one, recorded, in
	// progress or expired, having rolled back the handler's writes. The
	// caller then claims again without Optimistic, to answer from what the
	// other request left (or take an expired key over). A first execution
	// costs no read; a retry of a recorded key, or a duplicate running
	// alongside, costs a handler run that is rolled back. A store may
	// ignore it and claim as it always does. ClaimLeased ignores it.
	Optimistic bool

	// Call is, for a leased claim of a method that opted in to being
	// finished, what a finisher needs to run the call again when its
	// caller is gone; nil keeps nothing. Stores that implement [Finishing]
	// keep it with the claim until the outcome is recorded, and drop it
	// then. Claim ignores it.
	Call *Call
}

// Call is what a finisher needs to run a leased call again: the
// request and the metadata its handler reads.
type Call struct {
	// Method is the call's full method name ("/pkg.Service/Method"): the
	// key's scope may differ from it.
	Method string
	// Request is the request, in its deterministic protobuf encoding. It
	// can hold personal data: it is kept only while the call is in
	// progress.
	Request []byte
	// Metadata is the request metadata the handler needs, as an allowlist
	// chose it.
	Metadata map[string][]string
}

// AbandonedCall is a leased call whose lease ran out and which nobody took
// over, as [Finishing.Abandoned] finds it.
type AbandonedCall struct {
	// Scope is the call's scope.
	Scope Scope
	// Fingerprint is the fingerprint of its request.
	Fingerprint []byte
	// Call is what was kept to run it again.
	Call Call
	// Takeovers counts how often the key was taken over since it was
	// first claimed.
	Takeovers int
	// Unreadable, when not nil, says why the store could not read what it
	// kept of the call (a damaged row, say): Key, Fingerprint and
	// Takeovers are set, Call may be partial. The call cannot be run
	// again; a finisher takes it over and records it as failed, so that it
	// stops being listed and its retries get an answer.
	Unreadable error
}

// Finishing is implemented by stores that keep, for leased calls that
// opted in, what a finisher needs to finish them when their callers are
// gone (see idem.Finisher).
type Finishing interface {
	// Abandoned returns up to limit leased calls, kept with a [Call],
	// whose lease ran out more than grace × 2^Takeovers ago (so that each
	// failed attempt waits twice as long as the one before), and which
	// have not expired. A finisher takes one over with
	// [Store.ClaimLeased], with the same fingerprint and Call, as a retry
	// would. A call whose
	// kept request the store cannot read is listed too, with Unreadable
	// set, rather than failing the whole list. A store of several
	// databases may return, with an error, the calls of those that
	// answered before ctx ended; callers take them on all the same.
	Abandoned(ctx context.Context, grace time.Duration, limit int) ([]AbandonedCall, error)
}

// Claim is the result of [Store.Claim]: exactly one of Txn and Entry is set.
type Claim struct {
	// Txn is set when the caller now owns the key.
	Txn Txn
	// ExpiresAt is, with Txn, when the key will stop counting (by the
	// store's clock): its claim time plus the TTL. For an optimistic claim
	// that has not read the store's clock, the store may give its own
	// estimate.
	ExpiresAt time.Time
	// Entry is set when the key was already taken by another request.
	Entry *Entry
}

// Store claims idempotency keys and records outcomes.
type Store interface {
	// Claim takes key for the request r, or reports who has it. It returns
	// a Claim with Txn set when the key was free (or its entry had
	// expired), a Claim with Entry set when another request recorded its
	// outcome or is running it, and ErrInUse when the wait for a concurrent owner ran
	// out. The key is kept for r.TTL, or the store's default.
	Claim(ctx context.Context, key Scope, r Request) (Claim, error)

	// ClaimLeased takes key for the request r in leased mode: the claim is
	// durable at once and held for lease, and the handler's side effects
	// are its own. It returns a LeasedClaim with Lease set when the key was free,
	// had expired, or was held by a request with the same fingerprint whose
	// lease ran out (a takeover, reported by TookOver, which keeps the
	// saved steps and invalidates the earlier owner's Lease). Otherwise it
	// returns a LeasedClaim with Entry set: recorded, or in progress with
	// its LeaseRemaining (zero when an atomic claim holds it). It returns
	// ErrInUse when the wait for a concurrent atomic claim ran out, and
	// ErrCorrupt when the key's saved steps cannot be read.
	ClaimLeased(ctx context.Context, key Scope, r Request, lease time.Duration) (LeasedClaim, error)
}

// Txn is an owned claim. Exactly one of Record and Release takes effect;
// Release after Record does nothing, so it can be deferred.
type Txn interface {
	// Context returns a context derived from parent that carries what the
	// handler needs to join the claim (for PostgreSQL, the transaction that
	// holds it).
	Context(parent context.Context) context.Context

	// Record records out and makes the claim durable together with the
	// handler's writes. When out.Code is not OK, the handler's writes are
	// discarded and only the outcome is kept. On error nothing was recorded,
	// unless the error leaves the commit's result unknown; either way a
	// retry is safe. For an optimistic claim (Request.Optimistic) that
	// finds the key has an entry, it may fail with ErrConflict.
	Record(ctx context.Context, out Outcome) error

	// Release discards the claim and the handler's writes, so that a retry
	// runs afresh.
	Release(ctx context.Context) error
}

// LeasedClaim is the result of [Store.ClaimLeased]: exactly one of Lease and Entry
// is set.
type LeasedClaim struct {
	// Lease is set when the caller now holds the key.
	Lease Lease
	// ExpiresAt is, with Lease, when the key will stop counting (by the
	// store's clock). A takeover keeps the key's expiry.
	ExpiresAt time.Time
	// Entry is set when the key was taken by another request.
	Entry *Entry
	// TookOver reports, with Lease set, that the claim took the key over
	// from an earlier request with the same fingerprint whose lease had
	// run out (or ended at its Release, keeping its steps). It is
	// false for a key that was free or had expired.
	TookOver bool
}

// ErrInvalidStep reports a step that breaks the rules of [Step.Validate] or
// [MergeStep]. Nothing was saved; saving the same step again fails again.
var ErrInvalidStep = errors.New("store: invalid step")

// Bounds of a [Step].
const (
	// MaxStepLength is the longest step name, in bytes.
	MaxStepLength = 255
	// MaxStepResultBytes is the largest result of a step.
	MaxStepResultBytes = 64 << 10
)

// Step is a named step a leased request ran, with its result, a small
// payload to resume from (a provider's charge id, say).
type Step struct {
	// Name names the step: 1 to MaxStepLength bytes of valid UTF-8 with no
	// control characters.
	Name string
	// Result is the step's result, at most MaxStepResultBytes; it may be
	// empty.
	Result []byte
}

// Validate reports whether every store can keep p: Name must be 1 to
// [MaxStepLength] bytes of valid UTF-8 without control characters (U+0000
// to U+001F and U+007F, NUL among them), and Result at most
// [MaxStepResultBytes] bytes. The error, if any, wraps [ErrInvalidStep] and
// names the rule p breaks.
func (p Step) Validate() error {
	switch {
	case p.Name == "":
		return fmt.Errorf("%w: the step name is empty", ErrInvalidStep)
	case len(p.Name) > MaxStepLength:
		return fmt.Errorf("%w: the step name is %d bytes, more than %d", ErrInvalidStep, len(p.Name), MaxStepLength)
	case !utf8.ValidString(p.Name):
		return fmt.Errorf("%w: the step name is not valid UTF-8", ErrInvalidStep)
	case len(p.Result) > MaxStepResultBytes:
		return fmt.Errorf("%w: the step result is %d bytes, more than %d", ErrInvalidStep, len(p.Result), MaxStepResultBytes)
	}
	for i, r := range p.Name {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: the step name has control character %U at byte %d", ErrInvalidStep, r, i)
		}
	}
	return nil
}

// Bounds of the steps kept under one key.
const (
	// MaxSteps is the most steps a key keeps.
	MaxSteps = 64
	// MaxStepsBytes bounds the names and results of a key's steps,
	// together.
	MaxStepsBytes = 256 << 10
)

// MergeStep returns steps with p saved among them, for stores that implement
// [Lease]: in place of the step of the same name, or else appended. It
// refuses, with an error wrapping ErrInvalidStep, a step that fails
// Validate and one that would make the steps more than [MaxSteps] or
// [MaxStepsBytes]. steps is not modified.
func MergeStep(steps []Step, p Step) ([]Step, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	out := make([]Step, 0, len(steps)+1)
	size, found := 0, false
	for _, q := range steps {
		if q.Name == p.Name {
			q, found = p, true
		}
		size += len(q.Name) + len(q.Result)
		out = append(out, q)
	}
	if !found {
		out = append(out, p)
		size += len(p.Name) + len(p.Result)
	}
	switch {
	case len(out) > MaxSteps:
		return nil, fmt.Errorf("%w: a key keeps at most %d steps", ErrInvalidStep, MaxSteps)
	case size > MaxStepsBytes:
		return nil, fmt.Errorf("%w: the steps of a key hold at most %d bytes, this one would make them %d", ErrInvalidStep, MaxStepsBytes, size)
	}
	return out, nil
}

// Lease is a leased claim, guarded by a fencing token: each takeover of the
// key issues a new token, and every write below succeeds only while the
// token is still the key's; otherwise it returns ErrLeaseLost and changes
// nothing. A Lease is safe for concurrent use, so a heartbeat may Extend it
// while the handler saves steps.
//
// Exactly one of Record and Release takes effect, and either ends the
// lease. Once it has ended, or once it is lost (taken over, expired, or
// fenced by a forced [Admin] Forget or Settle), SaveStep, Extend and
// Record fail with ErrLeaseLost and change nothing, however often and in
// whatever order they are called: a second Record is refused so too,
// whether the first recorded or found the lease lost. Release after Record
// does nothing, so it can be deferred.
//
// SaveStep, Extend and Record honour ctx: with a context that has
// already ended they fail with its error (context.Canceled or
// context.DeadlineExceeded) and change nothing. A caller that must record
// past the end of its request, as the interceptor records a handler's
// outcome after the client has gone, passes a context detached from the
// request's. Release works whatever the state of ctx, so that it can be
// deferred from a request whose caller has gone.
type Lease interface {
	// LastStep returns the step saved last under the key: by an earlier
	// owner when the key was taken over, or by this one.
	LastStep() (Step, bool)

	// Steps returns every step saved under the key, in the order they
	// were first saved: a step saved again keeps its place with its new
	// result.
	Steps() []Step

	// SaveStep makes p durable at once, among the key's steps and as its
	// last one, so that a request that takes the key over skips it. A step
	// that fails [Step.Validate], or that [MergeStep] refuses, is refused
	// with its error, which wraps ErrInvalidStep, and nothing is saved.
	SaveStep(ctx context.Context, p Step) error

	// Extend moves the end of the lease to d from now.
	Extend(ctx context.Context, d time.Duration) error

	// Record records out and ends the lease.
	Record(ctx context.Context, out Outcome) error

	// Release gives the key up so that a retry runs: a claim without a
	// saved step is deleted, and one with steps keeps them and its lease
	// ends at once, so that a retry of the same request takes the key over
	// and resumes. A claim that keeps its request for a finisher
	// ([Request].Call, here or at an earlier claim of the key) is kept
	// too, with or without steps, so that a finisher finishes it if no
	// retry comes.
	Release(ctx context.Context) error
}

// ErrCorrupt reports a key whose stored state cannot be read back: for a
// leased claim, its saved steps, damaged outside idem (a manual edit, a
// faulty restore). A store returns it only for data it read and could not
// decode, never for a failure to reach or query its storage. The key's
// steps may have run, so no request under it may run them again: every
// claim of the key fails with ErrCorrupt, and retrying does not help, until
// an operator has checked its side effects and deleted the key (or it
// expires).
var ErrCorrupt = errors.New("store: the key's stored state is unreadable")
