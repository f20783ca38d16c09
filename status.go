package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem/internal/retryhint"
	"github.com/idemkit/idem/store"
)

// Values of google.rpc.ErrorInfo in idem's errors.
const (
	// Domain is the ErrorInfo domain of idem's errors.
	Domain = "idem"
	// ReasonKeyInUse: a request with the same key is still in flight; retry
	// after the RetryInfo delay.
	ReasonKeyInUse = "IDEMPOTENCY_KEY_IN_USE"
	// ReasonKeyReused: the key was used before with a different request;
	// use a new key for a new request.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonLeaseLost: a leased call ran past its lease and a retry took
	// the key over; this call's outcome was not recorded, the retry's
	// stands.
	ReasonLeaseLost = "IDEMPOTENCY_LEASE_LOST"
	// ReasonResponseNotCached: the call completed, but its response was too
	// large to record and the method can neither rebuild nor rerun it.
	ReasonResponseNotCached = "IDEMPOTENCY_RESPONSE_NOT_CACHED"
	// ReasonKeyMissing: the method requires an idempotency key and the call
	// carries none; the error also has a google.rpc.BadRequest violation on
	// idempotency-key. Send a new key with each new call, and the same key
	// with every retry of it.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: the call's idempotency key is malformed (see
	// [KeyHeader]; in an HTTP header, [HTTPKeyHeader]), sent more than
	// once, or differs from the request's key field; the BadRequest
	// violation on idempotency-key says what is wrong. So is a key sent to
	// a streaming method.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonScopeInvalid: the call's scope (its tenant, as the server's
	// [WithTenant] function found it, or its method) cannot hold an
	// idempotency key; see store.Scope.Validate. The same call fails again.
	ReasonScopeInvalid = "IDEMPOTENCY_SCOPE_INVALID"
	// ReasonStepsUnreadable: a leased call's saved steps cannot be read
	// (store.ErrCorrupt), answered with DATA_LOSS: its steps may have run,
	// so it is not run again, and retrying does not help until an operator
	// has checked it and deleted its key (see docs/operations.md, "Unreadable steps").
	ReasonStepsUnreadable = "IDEMPOTENCY_STEPS_UNREADABLE"
	// ReasonNotFinished: a leased call that a [Finisher] gave up on, as
	// recorded and replayed: it was abandoned by its caller and failed
	// every attempt to finish it, or what was kept of it cannot be read.
	// Its steps may be partly done.
	ReasonNotFinished = "IDEMPOTENCY_NOT_FINISHED"
)

// Error is idem's answer to a call it refused or could not run, and a
// recorded error it replays: a google.rpc.Status, which each transport
// sends in its own way (a gRPC status, a Connect error, an HTTP problem).
// The engine answers with it, package admin answers with it, and [NewError]
// makes one; programs see it through their transport.
type Error struct {
	status *spb.Status
}

// Error returns the status's code and message.
func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s", code.Code(e.status.GetCode()), e.status.GetMessage())
}

// Status returns the error as a google.rpc.Status. It is not a copy: do not
// change it.
func (e *Error) Status() *spb.Status { return e.status }

// RetryDelay returns the delay the error's RetryInfo suggests before a
// retry, and whether it has one: idem puts one on the answers a retry
// should wait for (the key in use, a lost lease, a store failure).
func (e *Error) RetryDelay() (time.Duration, bool) {
	return retryhint.Delay(e.status)
}

// RetryAfter returns the delay of RetryDelay as the value of an HTTP
// Retry-After header (RFC 9110): whole seconds, rounded up, so that a
// client that waits as told never retries early.
func (e *Error) RetryAfter() (string, bool) {
	d, ok := e.RetryDelay()
	if !ok {
		return "", false
	}
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10), true
}

// NewError returns an Error with code c, message msg and details (the
// google.rpc error details of package errdetails, say; one that cannot be
// marshaled is left out), for code that answers in idem's
// transport-neutral form and leaves the wire to idem's adapters: the
// admin service's answers (package admin) are Errors, and an
// admin.Authorizer that refuses a call with one is answered alike over
// gRPC and Connect. A handler answers with its own transport's error (a
// gRPC status, a *connect.Error), as it does without idem.
func NewError(c code.Code, msg string, details ...proto.Message) *Error {
	st := &spb.Status{Code: int32(c), Message: msg}
	for _, d := range details {
		a, err := anypb.New(d)
		if err != nil {
			continue // errdetails messages always marshal
		}
		st.Details = append(st.Details, a)
	}
	return &Error{status: st}
}

// withDetails is NewError as an error.
func withDetails(c code.Code, msg string, details ...proto.Message) error {
	return NewError(c, msg, details...)
}

// invalidKey is the error of a call whose key is malformed; reason says
// what is wrong with it.
func invalidKey(reason string) error {
	return withDetails(code.Code_INVALID_ARGUMENT, "idem: invalid idempotency key: "+reason,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field:       KeyHeader,
			Description: reason,
		}}},
		&errdetails.ErrorInfo{Reason: ReasonKeyInvalid, Domain: Domain})
}

// missingKey is the error of a call of method, which requires a key,
// without one.
func missingKey(method string) error {
	reason := "required by " + method
	return withDetails(code.Code_INVALID_ARGUMENT, "idem: the idempotency key is missing: "+reason,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field:       KeyHeader,
			Description: reason,
		}}},
		&errdetails.ErrorInfo{Reason: ReasonKeyMissing, Domain: Domain})
}

func keyInUse(delay time.Duration) error {
	return withDetails(code.Code_ABORTED, "idem: a request with this idempotency key is still in flight; retry later",
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)},
		&errdetails.ErrorInfo{Reason: ReasonKeyInUse, Domain: Domain})
}

func keyReused() error {
	return withDetails(code.Code_FAILED_PRECONDITION, "idem: this idempotency key was used with a different request; use a new key for a new request",
		&errdetails.ErrorInfo{Reason: ReasonKeyReused, Domain: Domain})
}

func leaseLost(delay time.Duration) error {
	return withDetails(code.Code_ABORTED, "idem: this call's lease on its idempotency key ran out and a retry took it over; its outcome was not recorded",
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)},
		&errdetails.ErrorInfo{Reason: ReasonLeaseLost, Domain: Domain})
}

// notRecorded is the answer to a leased call whose outcome could not be
// recorded: the claim stays in progress until its lease, delay from now at
// the latest, runs out, and then a retry takes it over.
func notRecorded(delay time.Duration, detail string) error {
	return withDetails(code.Code_UNAVAILABLE, "idem: the outcome of this call could not be recorded; retry after the delay"+detail,
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
}

func notCached() error {
	return withDetails(code.Code_FAILED_PRECONDITION, "idem: the request with this idempotency key completed, but its response was too large to record and cannot be rebuilt",
		&errdetails.ErrorInfo{Reason: ReasonResponseNotCached, Domain: Domain})
}

func scopeInvalid(err error) error {
	// The store's rule names the field and the rule it breaks, never the
	// value, which may be kilobytes of anything.
	rule := strings.TrimPrefix(err.Error(), store.ErrInvalidScope.Error()+": ")
	return withDetails(code.Code_INVALID_ARGUMENT, "idem: this call cannot hold an idempotency key: "+rule,
		&errdetails.ErrorInfo{Reason: ReasonScopeInvalid, Domain: Domain})
}

// storeError maps an error of the store, met while doing something for key
// (claiming, leasing, recording), to the status the client sees. A failure
// of the store left nothing behind, so each of them may be retried.
func (e *Engine) storeError(ctx context.Context, c *callState, doing string, err error) (answer, error) {
	key := c.key
	switch {
	case errors.Is(err, store.ErrInUse):
		return refuse(ResultInUse, keyInUse(e.opts.retryDelay))
	case errors.Is(err, store.ErrInvalidScope):
		return refuse(ResultInvalidKey, scopeInvalid(err))
	case errors.Is(err, store.ErrConflict):
		return refuse(ResultStoreError, withDetails(code.Code_ABORTED, "idem: transaction conflict; retry",
			&errdetails.RetryInfo{RetryDelay: durationpb.New(0)}))
	case errors.Is(err, store.ErrNotReady):
		return refuse(ResultStoreError, e.internalError(ctx, key, code.Code_INTERNAL, "the idempotency store is not set up", err))
	case errors.Is(err, context.Canceled):
		return refuse(ResultStoreError, NewError(code.Code_CANCELLED, err.Error()))
	case errors.Is(err, context.DeadlineExceeded):
		return refuse(ResultStoreError, NewError(code.Code_DEADLINE_EXCEEDED, err.Error()))
	}
	return refuse(ResultStoreError, e.internalError(ctx, key, code.Code_UNAVAILABLE, "storage failed while "+doing, err))
}

// internalError logs err, which happened to the call for key, and returns
// the status of code c the client gets: a message that says what failed,
// with err's text only under WithVerboseErrors, since it may name hosts,
// users and databases. UNAVAILABLE carries a RetryInfo.
func (e *Engine) internalError(ctx context.Context, key store.Scope, c code.Code, what string, err error) error {
	e.log(ctx, slog.LevelError, "idem: "+what, key, err)
	msg := "idem: " + what + e.detail(err)
	if c != code.Code_UNAVAILABLE {
		return NewError(c, msg)
	}
	return withDetails(c, msg+"; retry",
		&errdetails.RetryInfo{RetryDelay: durationpb.New(e.opts.retryDelay)})
}

// detail is what the client's message says of err: its text under
// WithVerboseErrors, else nothing.
func (e *Engine) detail(err error) string {
	if !e.opts.verbose {
		return ""
	}
	return ": " + err.Error()
}

// log logs msg at level with the scope of the call and err, if not nil.
func (e *Engine) log(ctx context.Context, level slog.Level, msg string, key store.Scope, err error) {
	l := e.opts.log()
	if !l.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", key.Method),
		slog.String("tenant", key.Tenant),
		slog.String("key", key.Key),
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	l.LogAttrs(ctx, level, msg, attrs...)
}

// errTooManyKeys is the error of a call that carried n values of its key.
func errTooManyKeys(n int) error {
	return fmt.Errorf("must have exactly one value, got %d", n)
}

// stepsUnreadable logs, at ERROR with its scope, and answers a leased call
// whose key's saved steps the store could not read.
func (e *Engine) stepsUnreadable(ctx context.Context, c *callState, err error) error {
	e.log(ctx, slog.LevelError, "idem: the saved steps of a leased call cannot be read, so it is not run again; "+
		"every retry is answered DATA_LOSS until an operator has checked its side effects and deleted its row (docs/operations.md, Unreadable steps)", c.key, err)
	return withDetails(code.Code_DATA_LOSS, "idem: the saved steps of the request with this idempotency key cannot be read, "+
		"so it cannot be resumed without running them twice; retrying does not help until the service's operator has checked it"+e.detail(err),
		&errdetails.ErrorInfo{Reason: ReasonStepsUnreadable, Domain: Domain})
}

// keysDiffer is the answer to a call whose request field field, marked
// (idem.v1.field).key, and its transport's key (metadata [KeyHeader], or an
// HTTP Idempotency-Key header) carry different keys: it names both, and
// blames neither alone.
func keysDiffer(field string) error {
	return withDetails(code.Code_INVALID_ARGUMENT,
		"idem: the request's field "+field+" and the call's "+KeyHeader+" (metadata, or HTTP header Idempotency-Key) carry different idempotency keys; "+
			"send the key in one of them, or the same key in both",
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: field, Description: "differs from the idempotency key in " + KeyHeader},
			{Field: KeyHeader, Description: "differs from the idempotency key in the request's field " + field},
		}},
		&errdetails.ErrorInfo{Reason: ReasonKeyInvalid, Domain: Domain})
}
