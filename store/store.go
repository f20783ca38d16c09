package store

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/code"
)

// The bounds every store enforces: of the fields of a [Scope], in bytes
// (together they stay well within what a PostgreSQL B-tree index entry can
// hold), of a [Step], of the steps an entry keeps, and of the fields of an
// audit entry.
const (
	// MaxTenantLength, MaxMethodLength and MaxKeyLength are the longest
	// Tenant, Method and Key of a Scope.
	MaxTenantLength = 255
	MaxMethodLength = 1024
	MaxKeyLength    = 255

	// MaxStepLength is the longest step name, in bytes.
	MaxStepLength = 255
	// MaxStepResultBytes is the largest result of a step.
	MaxStepResultBytes = 64 << 10

	// MaxSteps is the most steps an entry keeps.
	MaxSteps = 64
	// MaxStepsBytes bounds the names and results of an entry's steps,
	// together.
	MaxStepsBytes = 256 << 10

	// MaxReasonLength is the longest Reason of an [AuditEntry].
	MaxReasonLength = 1024
	// MaxAuditFieldLength is the longest Operator, RequestID and Peer of
	// an [AuditEntry].
	MaxAuditFieldLength = 255
)

// Scope is what a claim is made for: the client's idempotency key, within
// a tenant and a method. Two claims collide only when all three fields are
// equal. [Scope.Validate] states the rules every store enforces on them.
type Scope struct {
	// Tenant is the caller's tenant, which the server derives from its
	// identity; empty on a server without tenants.
	Tenant string
	// Method is the method's full name, "/package.Service/Method", or the
	// scope name its policy gives ((idem.v1.method).scope), which several
	// methods may share.
	Method string
	// Key is the client's idempotency key.
	Key string
}

// Validate reports whether every store can hold s: Tenant is 0 to
// [MaxTenantLength] bytes, Method 1 to [MaxMethodLength] bytes and Key 1 to
// [MaxKeyLength] bytes, each valid UTF-8 without a NUL byte. The error wraps
// [ErrInvalidScope] and names the field and the rule it breaks, never the
// field's value. Stores check it in every method that takes a Scope, before
// they touch their storage.
func (s Scope) Validate() error {
	if err := validateField("tenant", s.Tenant, 0, MaxTenantLength); err != nil {
		return err
	}
	if err := validateField("method", s.Method, 1, MaxMethodLength); err != nil {
		return err
	}
	return validateField("key", s.Key, 1, MaxKeyLength)
}

func validateField(name, v string, minLen, maxLen int) error {
	return validateFieldAs(ErrInvalidScope, name, v, minLen, maxLen)
}

// validateFieldAs checks v, the field name, as validateField does, with an
// error that wraps sentinel.
func validateFieldAs(sentinel error, name, v string, minLen, maxLen int) error {
	switch {
	case len(v) < minLen:
		return fmt.Errorf("%w: %s is empty", sentinel, name)
	case len(v) > maxLen:
		return fmt.Errorf("%w: %s is %d bytes, longer than the %d allowed", sentinel, name, len(v), maxLen)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", sentinel, name)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte", sentinel, name)
	}
	return nil
}

// State is the state of a scope's entry. A claim that finds the scope taken
// reports its entry as InProgress or Recorded ([Entry]); an operator also
// sees Abandoned and Expired ([KeyInfo]). The values are the same text in
// every store, the admin service and the command line.
type State string

// The states of an entry.
const (
	// InProgress is an entry whose request is still running: an atomic
	// claim not yet recorded or released, or a leased claim whose lease
	// is live.
	InProgress State = "in_progress"
	// Abandoned is a leased claim's entry whose lease ran out before its
	// outcome was recorded: its caller is gone, and a retry with the same
	// fingerprint, or a finisher, may take it over. A claim reports it as
	// InProgress, with no LeaseRemaining.
	Abandoned State = "abandoned"
	// Recorded is an entry whose outcome is recorded: later claims of the
	// scope are answered with it.
	Recorded State = "recorded"
	// Expired is an entry past its expiry, which counts as absent: no
	// claim reports it, the next claim of its scope takes it over as if
	// the scope were free, and a store deletes it in its own time.
	Expired State = "expired"
)

// Entry is what a claim found when the scope was taken.
type Entry struct {
	// State is InProgress or Recorded.
	State State
	// Fingerprint is the fingerprint of the request that took the scope.
	Fingerprint []byte
	// Outcome is the recorded outcome; it is set when State is Recorded.
	Outcome Outcome
	// ExpiresAt is when the entry stops counting (by the store's clock).
	ExpiresAt time.Time
	// LeaseRemaining is, for an in-progress entry held by a leased claim,
	// how long its lease still runs (by the store's clock); zero otherwise,
	// and zero once the lease has run out.
	LeaseRemaining time.Duration
}

// Outcome is what a call's handler produced, as recorded and replayed.
type Outcome struct {
	// Code is the status code of the call (google.rpc.Code, which gRPC and
	// Connect share).
	Code code.Code
	// Body is the outcome as idem encodes it: the response, or the
	// error's google.rpc.Status, with the response metadata a replay
	// sends again. It is opaque to the store, which keeps it and gives it
	// back byte for byte. When NotCached is set it holds a reference to
	// the response instead.
	Body []byte
	// NotCached marks an OK outcome whose response was too large to keep:
	// Body is a small reference (the created row's id, say) from which the
	// response can be rebuilt, possibly empty.
	NotCached bool
}

// ClaimRequest is what an atomic claim ([Store.Claim]) keeps of the call
// besides its scope.
type ClaimRequest struct {
	// Fingerprint is the request's fingerprint: a later claim of the scope
	// is answered with its outcome only when it comes with the same one.
	Fingerprint []byte
	// TTL is how long the entry is kept once claimed: past it the entry
	// counts as absent. Zero selects the store's default.
	TTL time.Duration
	// Optimistic lets Claim read nothing before the handler runs: the
	// scope is not looked at until [Txn.Record], which writes its entry
	// where there is none and fails with ErrConflict where there is one
	// (recorded, in progress or expired), having discarded the handler's
	// writes. The caller then claims again without Optimistic, to answer
	// from what the other request left (or take an expired entry over). A
	// first execution costs no read; a retry of a recorded scope, or a
	// duplicate running alongside, costs a handler run that is discarded.
	// A store may ignore it and claim as it always does.
	Optimistic bool
}

// LeaseRequest is what a leased claim ([Store.ClaimLeased]) keeps of the
// call besides its scope.
type LeaseRequest struct {
	// Fingerprint is the request's fingerprint: a later claim of the scope
	// is answered with its outcome, or takes its lease over once it has
	// run out, only when it comes with the same one.
	Fingerprint []byte
	// TTL is how long the entry is kept once claimed: past it the entry
	// counts as absent. Zero selects the store's default. A takeover keeps
	// the entry's expiry.
	TTL time.Duration
	// Lease is how long the claim is held from now: until it has run out,
	// no other claim takes the scope over. [Lease.Extend] moves its end.
	Lease time.Duration
	// Call is, for a method that opted in to being finished, what a
	// finisher needs to run the call again if its caller is gone; nil
	// keeps nothing, and a takeover with nil keeps what an earlier claim
	// of the entry kept. A store that implements [Finishing] keeps it with
	// the entry until the outcome is recorded, and drops it then; any
	// other store ignores it.
	Call *Call
}

// Store claims scopes and records outcomes. It is safe for concurrent use.
type Store interface {
	// Claim takes s for the request r, atomically with the handler's
	// writes, or reports who has it. It returns a Claim with Txn set when
	// s was free (or its entry had expired), and a Claim with Entry set
	// when another request recorded its outcome or is running it. Of any
	// number of concurrent claims of s, exactly one gets a Txn: the others
	// wait for its owner to record or release it, for a bound of the
	// store's own, and then get its Entry (or, after a release, a Txn of
	// their own, one of them), or ErrInUse when the bound runs out. An
	// entry that a leased claim holds is answered at once, live lease or
	// not. The entry is kept for r.TTL, or the store's default.
	Claim(ctx context.Context, s Scope, r ClaimRequest) (Claim, error)

	// ClaimLeased takes s for the request r in leased mode: the claim is
	// durable at once, before the handler runs, and held for r.Lease; the
	// handler's side effects are its own. It returns a LeasedClaim with
	// Lease set when s was free, had expired (which starts afresh, without
	// the entry's steps or expiry), or was held by a request with the same
	// fingerprint whose lease ran out: a takeover, reported by TookOver,
	// which keeps the entry's steps, expiry and kept Call and issues a new
	// fencing token, so that every later write of the earlier holder's
	// Lease fails with ErrLeaseLost. Of concurrent claims, exactly one
	// gets the Lease. Otherwise it returns a LeasedClaim with Entry set:
	// recorded, or in progress with its LeaseRemaining (zero when its
	// lease has run out under another fingerprint, or when an atomic
	// claim holds s, which ClaimLeased waits for as Claim does). It
	// returns ErrInUse when that wait runs out, and ErrCorrupt when the
	// entry's saved steps cannot be read.
	ClaimLeased(ctx context.Context, s Scope, r LeaseRequest) (LeasedClaim, error)
}

// Claim is the result of [Store.Claim]: exactly one of Txn and Entry is set.
type Claim struct {
	// Txn is set when the caller now owns the scope.
	Txn Txn
	// ExpiresAt is, with Txn, when the entry will stop counting (by the
	// store's clock): its claim time plus the TTL. For an optimistic claim
	// that has not read the store's clock, the store may give its own
	// estimate.
	ExpiresAt time.Time
	// Entry is set when the scope was already taken by another request.
	Entry *Entry
}

// Txn is an atomic claim its caller owns. Exactly one of Record and
// Release takes effect; Release after Record does nothing, so it can be
// deferred. Until either is called, other claims of the scope see no
// entry they could answer from: they wait.
type Txn interface {
	// Context returns a context derived from parent that carries what the
	// handler needs to join the claim (for PostgreSQL, the transaction that
	// holds it), so that its writes and the record commit together or not
	// at all.
	Context(parent context.Context) context.Context

	// Record records out as the entry's outcome and makes it durable
	// together with the handler's writes. When out.Code is not OK, the
	// handler's writes are discarded and only the outcome is kept. On
	// error nothing was recorded, unless the error leaves the commit's
	// result unknown; either way a retry is safe. For an optimistic claim
	// ([ClaimRequest].Optimistic) that finds the scope taken, it fails
	// with ErrConflict. A second Record fails.
	Record(ctx context.Context, out Outcome) error

	// Release discards the claim and the handler's writes, leaving no
	// entry, so that a retry runs afresh.
	Release(ctx context.Context) error
}

// LeasedClaim is the result of [Store.ClaimLeased]: exactly one of Lease
// and Entry is set.
type LeasedClaim struct {
	// Lease is set when the caller now holds the scope.
	Lease Lease
	// ExpiresAt is, with Lease, when the entry will stop counting (by the
	// store's clock). A takeover keeps the entry's expiry.
	ExpiresAt time.Time
	// Entry is set when the scope was taken by another request.
	Entry *Entry
	// TookOver reports, with Lease set, that the claim took the scope over
	// from an earlier request with the same fingerprint whose lease had
	// run out (or ended at its Release, keeping its steps or its Call). It
	// is false for a scope that was free or had expired.
	TookOver bool
}

// Lease is a leased claim, guarded by a fencing token: each claim and each
// takeover of the scope issues a token no earlier holder had, and every
// write below succeeds only while the token is still the entry's;
// otherwise it returns ErrLeaseLost and changes nothing. A Lease is safe
// for concurrent use, so a heartbeat may Extend it while the handler saves
// steps.
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
// past the end of its request, as idem's engine records a handler's
// outcome after the client has gone, passes a context detached from the
// request's. Release works whatever the state of ctx, so that it can be
// deferred from a request whose caller has gone.
//
// # Steps
//
// The entry keeps the steps saved under it, by any holder, in the order
// they were first saved. SaveStep merges a step into them by its name: in
// place of the step of the same name, keeping that step's place, or else
// appended. It refuses a step that fails [Step.Validate], and one that
// would make the entry hold more than [MaxSteps] steps or names and
// results of more than [MaxStepsBytes] bytes together, with an error
// wrapping ErrInvalidStep, and saves nothing.
type Lease interface {
	// Steps returns every step saved under the entry, by this holder or
	// an earlier one, in the order they were first saved.
	Steps() []Step

	// SaveStep makes p durable at once among the entry's steps (see
	// Steps, above), so that a request that takes the scope over skips
	// it.
	SaveStep(ctx context.Context, p Step) error

	// Extend moves the end of the lease to d from now.
	Extend(ctx context.Context, d time.Duration) error

	// Record records out as the entry's outcome and ends the lease; the
	// steps and the kept Call are not read again, and the Call is dropped.
	Record(ctx context.Context, out Outcome) error

	// Release gives the scope up so that a retry runs: an entry without a
	// saved step is deleted, and one with steps keeps them and its lease
	// ends at once, so that a retry of the same request takes it over and
	// resumes. An entry that keeps a Call for a finisher
	// ([LeaseRequest].Call, here or at an earlier claim of the entry) is
	// kept too, with or without steps, so that a finisher finishes it if
	// no retry comes.
	Release(ctx context.Context) error
}

// Step is a named unit of a leased handler's work that ran, with its
// result: a small payload to resume from (a provider's charge id, say).
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

// Call is what a finisher needs to run a leased call again: the request
// and the metadata its handler reads.
type Call struct {
	// Method is the call's full method name ("/pkg.Service/Method"): the
	// scope's Method may differ from it.
	Method string
	// Request is the request, in its deterministic protobuf encoding. It
	// can hold personal data: it is kept only while the call is in
	// progress.
	Request []byte
	// Metadata is the request metadata the handler needs, as an allowlist
	// chose it: lower-case names, each with its values in order.
	Metadata map[string][]string
}

// Finishing is implemented by stores that keep, for leased calls that
// opted in ([LeaseRequest].Call), what a finisher needs to finish them
// when their callers are gone (see idem.Finisher). Callers discover it by
// a type assertion on the [Store].
type Finishing interface {
	// Abandoned returns up to limit entries in progress that keep a
	// [Call], whose lease ran out more than grace × 2^Takeovers ago (so
	// that each failed attempt waits twice as long as the one before),
	// and which have not expired. A finisher takes one over with
	// [Store.ClaimLeased], with the same fingerprint, as a retry would.
	// An entry whose kept Call the store cannot read is listed too, with
	// Unreadable set, rather than failing the whole list. A store of
	// several databases may return, with an error, the calls of those
	// that answered before ctx ended; callers take them on all the same.
	Abandoned(ctx context.Context, grace time.Duration, limit int) ([]AbandonedCall, error)
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
	// Takeovers counts how often the entry was taken over since it was
	// first claimed.
	Takeovers int
	// Unreadable, when not nil, says why the store could not read what it
	// kept of the call (a damaged row, say): Scope, Fingerprint and
	// Takeovers are set, Call may be partial. The call cannot be run
	// again; a finisher takes it over and records it as failed, so that it
	// stops being listed and its retries get an answer.
	Unreadable error
}

// ReplayCounter is implemented by stores that count, per entry, the calls
// answered from its recorded outcome, and when the last was, for an
// operator to see ([KeyInfo].Replays and LastReplay): whether a call was
// retried, and how often. idem's engine calls CountReplay for every
// replay, unless told not to (idem.WithReplayCounts). Callers discover it
// by a type assertion on the [Store].
//
// The counts are a record for operators, never a decision: a store may
// keep them in memory and write them in batches, so that a replay costs
// no write, and may lose those it has not written yet (a crash, a write
// that keeps failing). An entry deleted, taken over afresh after it
// expired, or not recorded, by the time its counts are written does not
// get them: writing them then changes nothing and is no error. An entry
// taken over afresh starts from no replays.
type ReplayCounter interface {
	// CountReplay counts one replay of s's entry, now, by the store's
	// clock. It returns at once, without I/O and without waiting for any:
	// it is on the replay's path. It refuses nothing: a scope the store
	// cannot hold is never replayed.
	CountReplay(s Scope)

	// FlushReplays writes the counts the store keeps in memory, and
	// returns once they are written, or fail to be, or ctx ends. Counts
	// it could not write are kept for the next flush, as far as the
	// store's bound on them allows. Call it at shutdown, before closing
	// what the store writes to, so that the last counts are not lost.
	FlushReplays(ctx context.Context) error
}
