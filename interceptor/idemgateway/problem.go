package idemgateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
)

// problemContentType is the media type of problem details in JSON
// (RFC 9457).
const problemContentType = "application/problem+json"

// idemDoc is where the type URIs of idem's problem details point: the
// documentation of the reason's constant in package idem.
const idemDoc = "https://pkg.go.dev/github.com/idemkit/idem#"

// problem is the body of one of idem's answers: problem details (RFC 9457)
// with the extension member reason.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Reason string `json:"reason"`

	// retryAfter is the value of the Retry-After header, if any.
	retryAfter string
}

// ErrorHandler returns an error handler that answers idem's errors as the
// IETF draft says, with problem details (see the package documentation for
// the statuses), and leaves every other error to next, by default (nil)
// grpc-gateway's [runtime.DefaultHTTPErrorHandler].
//
// For idem's errors next runs too, with the status and body taken over: it
// forwards the response metadata as the ServeMux's header and trailer
// matchers say, as it would for any error. Every error that carries a
// google.rpc.RetryInfo gets a Retry-After header from it, idem's own
// (an UNAVAILABLE store failure, an ABORTED conflict in the store) and the
// service's alike.
func ErrorHandler(next runtime.ErrorHandlerFunc) runtime.ErrorHandlerFunc {
	if next == nil {
		next = runtime.DefaultHTTPErrorHandler
	}
	return func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
		p := problemFor(err)
		if p == nil {
			if d, ok := retryDelay(err); ok {
				w.Header().Set("Retry-After", retryAfter(d))
			}
			next(ctx, mux, m, w, r, err)
			return
		}
		pw := &problemWriter{ResponseWriter: w, p: p}
		next(ctx, mux, m, pw, r, err)
		pw.WriteHeader(p.Status) // when next wrote nothing
	}
}

// problemWriter writes p as the response, with the headers its writer set
// before it, when its writer first writes; it discards the writer's body.
type problemWriter struct {
	http.ResponseWriter
	p       *problem
	written bool
}

func (w *problemWriter) WriteHeader(int) {
	if w.written {
		return
	}
	w.written = true
	writeProblem(w.ResponseWriter, w.p)
}

func (w *problemWriter) Write(b []byte) (int, error) {
	w.WriteHeader(0)
	return len(b), nil
}

// writeProblem answers with p.
func writeProblem(w http.ResponseWriter, p *problem) {
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Del("Content-Length")
	if p.retryAfter != "" {
		h.Set("Retry-After", p.retryAfter)
	}
	body, _ := json.Marshal(p) // strings and an int
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// problemFor returns the problem of err, or nil when err is not one of
// idem's answers. What the answer is, the server decided: the ErrorInfo
// reason of idem's error says it, and a BadRequest violation on
// idempotency-key without one (from a server of an idem release that set
// none) is a malformed key.
func problemFor(err error) *problem {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	var (
		info      *errdetails.ErrorInfo
		retry     *errdetails.RetryInfo
		violation *errdetails.BadRequest_FieldViolation
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == idem.Domain {
				info = d
			}
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				if v.GetField() == idem.KeyHeader {
					violation = v
				}
			}
		}
	}
	var p *problem
	switch {
	case info != nil:
		p = reasonProblem(info.GetReason(), st, violation)
	case violation != nil && st.Code() == codes.InvalidArgument:
		p = keyInvalid(violation.GetDescription())
	}
	if p != nil && retry != nil {
		p.retryAfter = retryAfter(retry.GetRetryDelay().AsDuration())
	}
	return p
}

// retryDelay returns the delay of the RetryInfo that err's status carries.
func retryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			return r.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// reasonProblem returns the problem of st, one of idem's errors with
// ErrorInfo reason and, for a key that is missing or malformed, violation
// (nil if none), or nil for a reason it does not know.
func reasonProblem(reason string, st *status.Status, violation *errdetails.BadRequest_FieldViolation) *problem {
	switch reason {
	case idem.ReasonKeyMissing:
		return &problem{
			Type:   idemDoc + "ReasonKeyMissing",
			Title:  "Idempotency-Key is missing",
			Status: http.StatusBadRequest,
			Detail: "This operation requires an Idempotency-Key header: a new key with each new request, and the same key with every retry of it.",
			Reason: reason,
		}
	case idem.ReasonKeyInvalid:
		if violation == nil {
			return keyInvalid(st.Message())
		}
		return keyInvalid(violation.GetDescription())
	case idem.ReasonKeyInUse:
		return &problem{
			Type:   idemDoc + "ReasonKeyInUse",
			Title:  "A request is outstanding for this Idempotency-Key",
			Status: http.StatusConflict,
			Detail: "A request with this Idempotency-Key is still being processed; retry after the Retry-After delay to get its answer.",
			Reason: reason,
		}
	case idem.ReasonKeyReused:
		return &problem{
			Type:   idemDoc + "ReasonKeyReused",
			Title:  "Idempotency-Key is already used",
			Status: http.StatusUnprocessableEntity,
			Detail: "This Idempotency-Key was used with a different request to this operation; send a new key with a new request.",
			Reason: reason,
		}
	case idem.ReasonLeaseLost:
		return &problem{
			Type:   idemDoc + "ReasonLeaseLost",
			Title:  "The request lost its Idempotency-Key to a retry",
			Status: runtime.HTTPStatusFromCode(st.Code()),
			Detail: "This request ran past its lease on the Idempotency-Key and a retry took the key over, so its outcome was not recorded; retry to get the answer that stands.",
			Reason: reason,
		}
	case idem.ReasonResponseNotCached:
		return &problem{
			Type:   idemDoc + "ReasonResponseNotCached",
			Title:  "The response for this Idempotency-Key was not kept",
			Status: runtime.HTTPStatusFromCode(st.Code()),
			Detail: "The request with this Idempotency-Key completed, but its response was too large to record and cannot be rebuilt.",
			Reason: reason,
		}
	case idem.ReasonScopeInvalid:
		return &problem{
			Type:   idemDoc + "ReasonScopeInvalid",
			Title:  "The request cannot hold an Idempotency-Key",
			Status: runtime.HTTPStatusFromCode(st.Code()),
			Detail: st.Message(), // names the rule the scope breaks
			Reason: reason,
		}
	case idem.ReasonStepsUnreadable:
		return &problem{
			Type:   idemDoc + "ReasonStepsUnreadable",
			Title:  "The request for this Idempotency-Key cannot be resumed",
			Status: runtime.HTTPStatusFromCode(st.Code()),
			Detail: "The saved steps of the request with this Idempotency-Key cannot be read, so it cannot be resumed without running them twice; retrying does not help until the service's operator has checked it.",
			Reason: reason,
		}
	case idem.ReasonNotFinished:
		return &problem{
			Type:   idemDoc + "ReasonNotFinished",
			Title:  "The request for this Idempotency-Key was not finished",
			Status: runtime.HTTPStatusFromCode(st.Code()),
			Detail: "The request with this Idempotency-Key was abandoned before it finished and could not be finished later; its effects may be partly done.",
			Reason: reason,
		}
	}
	return nil
}

// headerInvalid returns the problem of a malformed Idempotency-Key header;
// what says what is wrong with it.
func headerInvalid(what string) *problem {
	p := keyInvalid("")
	p.Detail = "The Idempotency-Key header is malformed: " + what + "."
	return p
}

// keyInvalid returns the problem of a malformed key, as the server found
// it, in the header or in the request's key field; what says what is wrong
// with it.
func keyInvalid(what string) *problem {
	return &problem{
		Type:   idemDoc + "ReasonKeyInvalid",
		Title:  "Idempotency-Key is malformed",
		Status: http.StatusBadRequest,
		Detail: "The idempotency key is malformed: " + what + ".",
		Reason: idem.ReasonKeyInvalid,
	}
}

// retryAfter returns d as a Retry-After value: whole seconds, rounded up.
func retryAfter(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	s := d / time.Second
	if d%time.Second > 0 {
		s++
	}
	return strconv.FormatInt(int64(s), 10)
}
