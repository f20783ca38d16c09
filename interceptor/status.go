package interceptor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

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
	// [ValidateKey]; in an HTTP header, [ParseHTTPKey]), sent more than
	// once, or differs from the request's key field; the BadRequest
	// violation on idempotency-key says what is wrong.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonScopeInvalid: the call's scope (its tenant, as the server's
	// TenantResolver found it, or its method) cannot hold an idempotency
	// key; see store.Key.Validate. The same call fails again.
	ReasonScopeInvalid = "IDEMPOTENCY_SCOPE_INVALID"
)

func withDetails(c codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st, err := status.New(c, msg).WithDetails(details...)
	if err != nil {
		// Only a detail that cannot be marshalled fails, and ours can.
		return status.Error(c, msg)
	}
	return st.Err()
}

// invalidKey is the error of a call whose key is malformed; reason says
// what is wrong with it.
func invalidKey(reason string) error {
	return withDetails(codes.InvalidArgument, "idem: invalid idempotency key: "+reason,
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
	return withDetails(codes.InvalidArgument, "idem: the idempotency key is missing: "+reason,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field:       KeyHeader,
			Description: reason,
		}}},
		&errdetails.ErrorInfo{Reason: ReasonKeyMissing, Domain: Domain})
}

func keyInUse(delay time.Duration) error {
	return withDetails(codes.Aborted, "idem: a request with this idempotency key is still in flight; retry later",
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)},
		&errdetails.ErrorInfo{Reason: ReasonKeyInUse, Domain: Domain})
}

func keyReused() error {
	return withDetails(codes.FailedPrecondition, "idem: this idempotency key was used with a different request; use a new key for a new request",
		&errdetails.ErrorInfo{Reason: ReasonKeyReused, Domain: Domain})
}

func leaseLost(delay time.Duration) error {
	return withDetails(codes.Aborted, "idem: this call's lease on its idempotency key ran out and a retry took it over; its outcome was not recorded",
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)},
		&errdetails.ErrorInfo{Reason: ReasonLeaseLost, Domain: Domain})
}

// notRecorded is the answer to a leased call whose outcome could not be
// recorded: the claim stays in progress until its lease, delay from now at
// the latest, runs out, and then a retry takes it over.
func notRecorded(delay time.Duration, detail string) error {
	return withDetails(codes.Unavailable, "idem: the outcome of this call could not be recorded; retry after the delay"+detail,
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
}

func notCached() error {
	return withDetails(codes.FailedPrecondition, "idem: the request with this idempotency key completed, but its response was too large to record and cannot be rebuilt",
		&errdetails.ErrorInfo{Reason: ReasonResponseNotCached, Domain: Domain})
}

func scopeInvalid(err error) error {
	// The store's rule names the field and the rule it breaks, never the
	// value, which may be kilobytes of anything.
	rule := strings.TrimPrefix(err.Error(), store.ErrInvalidKey.Error()+": ")
	return withDetails(codes.InvalidArgument, "idem: this call cannot hold an idempotency key: "+rule,
		&errdetails.ErrorInfo{Reason: ReasonScopeInvalid, Domain: Domain})
}

// storeError maps an error of the store, met while doing something for key
// (claiming, leasing, recording), to the status the client sees. A failure
// of the store left nothing behind, so each of them may be retried.
func (e *Engine) storeError(ctx context.Context, c *callState, doing string, err error) error {
	key := c.key
	switch {
	case errors.Is(err, store.ErrInUse):
		c.settle(ResultInUse)
		return keyInUse(e.opts.retryDelay)
	case errors.Is(err, store.ErrInvalidKey):
		c.settle(ResultInvalidKey)
		return scopeInvalid(err)
	}
	c.settle(ResultStoreError)
	switch {
	case errors.Is(err, store.ErrConflict):
		return withDetails(codes.Aborted, "idem: transaction conflict; retry",
			&errdetails.RetryInfo{RetryDelay: durationpb.New(0)})
	case errors.Is(err, store.ErrNotReady):
		// Not UNAVAILABLE: no retry helps until an operator sets the store
		// up, and the log says how.
		return e.internalError(ctx, key, codes.Internal, "the idempotency store is not set up", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return e.internalError(ctx, key, codes.Unavailable, "storage failed while "+doing, err)
}

// internalError logs err, which happened to the call for key, and returns
// the status of code c the client gets: a message that says what failed,
// with err's text only under WithVerboseErrors, since it may name hosts,
// users and databases. UNAVAILABLE carries a RetryInfo.
func (e *Engine) internalError(ctx context.Context, key store.Key, c codes.Code, what string, err error) error {
	e.log(ctx, slog.LevelError, "idem: "+what, key, err)
	msg := "idem: " + what + e.detail(err)
	if c != codes.Unavailable {
		return status.Error(c, msg)
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
func (e *Engine) log(ctx context.Context, level slog.Level, msg string, key store.Key, err error) {
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

// ReasonStepsUnreadable is the ErrorInfo reason of a leased call whose
// saved steps cannot be read (store.ErrCorrupt), answered with DATA_LOSS:
// its steps may have run, so it is not run again, and retrying does not
// help until an operator has checked it and deleted its key (see the
// README, "Operations").
const ReasonStepsUnreadable = "IDEMPOTENCY_STEPS_UNREADABLE"

// stepsUnreadable logs, at ERROR with its scope, and answers a leased call
// whose key's saved steps the store could not read.
func (e *Engine) stepsUnreadable(ctx context.Context, c *callState, err error) error {
	c.settle(ResultStoreError)
	e.log(ctx, slog.LevelError, "idem: the saved steps of a leased call cannot be read, so it is not run again; "+
		"every retry is answered DATA_LOSS until an operator has checked its side effects and deleted its row (README, Operations)", c.key, err)
	return withDetails(codes.DataLoss, "idem: the saved steps of the request with this idempotency key cannot be read, "+
		"so it cannot be resumed without running them twice; retrying does not help until the service's operator has checked it"+e.detail(err),
		&errdetails.ErrorInfo{Reason: ReasonStepsUnreadable, Domain: Domain})
}

// keysDiffer is the answer to a call whose request field field, marked
// (idem.v1.field).key, and its transport's key (metadata [KeyHeader], or an
// HTTP Idempotency-Key header) carry different keys: it names both, and
// blames neither alone.
func keysDiffer(field string) error {
	return withDetails(codes.InvalidArgument,
		"idem: the request's field "+field+" and the call's "+KeyHeader+" (metadata, or HTTP header Idempotency-Key) carry different idempotency keys; "+
			"send the key in one of them, or the same key in both",
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: field, Description: "differs from the idempotency key in " + KeyHeader},
			{Field: KeyHeader, Description: "differs from the idempotency key in the request's field " + field},
		}},
		&errdetails.ErrorInfo{Reason: ReasonKeyInvalid, Domain: Domain})
}
