package idemgateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemgateway"
)

func TestIncomingHeaderMatcher(t *testing.T) {
	legacy := idemgateway.IncomingHeaderMatcher(runtime.LegacyHeaderMatcher)
	for _, c := range []struct {
		match     runtime.HeaderMatcherFunc
		header    string
		name      string
		forwarded bool
	}{
		{idemgateway.IncomingHeaderMatcher(nil), "Idempotency-Key", idem.KeyHeader, true},
		{idemgateway.IncomingHeaderMatcher(nil), "idempotency-key", idem.KeyHeader, true},
		{idemgateway.IncomingHeaderMatcher(nil), "Idempotency-Attempt", idem.AttemptHeader, true},
		{idemgateway.IncomingHeaderMatcher(nil), "Accept", "grpcgateway-Accept", true}, // the default's
		{idemgateway.IncomingHeaderMatcher(nil), "X-Tenant-Id", "", false},             // the default's
		{idemgateway.IncomingHeaderMatcher(tenantHeaders), "X-Tenant-Id", "x-tenant-id", true},
		{legacy, "Grpc-Metadata-Trace", "Trace", true},
		// Only Idempotency-Key, parsed, carries the key.
		{legacy, "Grpc-Metadata-Idempotency-Key", "", false},
	} {
		name, ok := c.match(c.header)
		if name != c.name || ok != c.forwarded {
			t.Errorf("%s: %q, %v; want %q, %v", c.header, name, ok, c.name, c.forwarded)
		}
	}
}

func TestOutgoingHeaderMatcher(t *testing.T) {
	upper := func(key string) (string, bool) { return strings.ToUpper(key), key != "secret" }
	for _, c := range []struct {
		match     runtime.HeaderMatcherFunc
		key       string
		name      string
		forwarded bool
	}{
		{idemgateway.OutgoingHeaderMatcher(nil), idem.ReplayedHeader, idem.HTTPReplayedHeader, true},
		{idemgateway.OutgoingHeaderMatcher(nil), idem.ExpiresHeader, "Idempotency-Key-Expires", true},
		{idemgateway.OutgoingHeaderMatcher(upper), idem.ExpiresHeader, "Idempotency-Key-Expires", true},
		{idemgateway.OutgoingHeaderMatcher(nil), "x-request-id", "Grpc-Metadata-x-request-id", true}, // the default's
		{idemgateway.OutgoingHeaderMatcher(upper), idem.ReplayedHeader, idem.HTTPReplayedHeader, true},
		{idemgateway.OutgoingHeaderMatcher(upper), "x-request-id", "X-REQUEST-ID", true},
		{idemgateway.OutgoingHeaderMatcher(upper), "secret", "SECRET", false},
	} {
		name, ok := c.match(c.key)
		if name != c.name || ok != c.forwarded {
			t.Errorf("%s: %q, %v; want %q, %v", c.key, name, ok, c.name, c.forwarded)
		}
	}
}

// statusErr returns an error of code c with details.
func statusErr(c codes.Code, details ...protoadapt.MessageV1) error {
	st, err := status.New(c, "idem: the message").WithDetails(details...)
	if err != nil {
		panic(err)
	}
	return st.Err()
}

func idemInfo(reason string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: idem.Domain}
}

func retryInfo(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

func keyViolation(description string) *errdetails.BadRequest {
	return &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
		Field: idem.KeyHeader, Description: description,
	}}}
}

// TestErrorHandler: the ServeMux's error handler answers each of idem's
// errors with its status, a problem detail and Retry-After from RetryInfo,
// rounded up, and passes every other error to grpc-gateway's default.
func TestErrorHandler(t *testing.T) {
	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	for _, c := range []struct {
		name       string
		key        string // the request's Idempotency-Key header, if any
		err        error
		status     int
		reason     string // "": not a problem, grpc-gateway's answer
		retryAfter string
	}{
		{"in use", "k", statusErr(codes.Aborted, retryInfo(1500*time.Millisecond), idemInfo(idem.ReasonKeyInUse)),
			http.StatusConflict, idem.ReasonKeyInUse, "2"},
		{"in use, whole seconds", "k", statusErr(codes.Aborted, retryInfo(time.Second), idemInfo(idem.ReasonKeyInUse)),
			http.StatusConflict, idem.ReasonKeyInUse, "1"},
		{"in use, just over", "k", statusErr(codes.Aborted, retryInfo(time.Second+time.Nanosecond), idemInfo(idem.ReasonKeyInUse)),
			http.StatusConflict, idem.ReasonKeyInUse, "2"},
		{"reused", "k", statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonKeyReused)),
			http.StatusUnprocessableEntity, idem.ReasonKeyReused, ""},
		{"lease lost", "k", statusErr(codes.Aborted, retryInfo(0), idemInfo(idem.ReasonLeaseLost)),
			http.StatusConflict, idem.ReasonLeaseLost, "0"},
		{"not cached", "k", statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonResponseNotCached)),
			http.StatusBadRequest, idem.ReasonResponseNotCached, ""},
		{"scope invalid", "k", statusErr(codes.InvalidArgument, idemInfo(idem.ReasonScopeInvalid)),
			http.StatusBadRequest, idem.ReasonScopeInvalid, ""},
		{"steps unreadable", "k", statusErr(codes.DataLoss, idemInfo(idem.ReasonStepsUnreadable)),
			http.StatusInternalServerError, idem.ReasonStepsUnreadable, ""},
		{"not finished", "k", statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonNotFinished)),
			http.StatusBadRequest, idem.ReasonNotFinished, ""},
		{"missing", "", statusErr(codes.InvalidArgument, keyViolation("required by /pkg.Svc/M"), idemInfo(idem.ReasonKeyMissing)),
			http.StatusBadRequest, idem.ReasonKeyMissing, ""},
		{"invalid", "k", statusErr(codes.InvalidArgument, keyViolation("must have exactly one value, got 2"), idemInfo(idem.ReasonKeyInvalid)),
			http.StatusBadRequest, idem.ReasonKeyInvalid, ""},
		// The server decides, not the header: a key in the request's
		// field is malformed although no header came.
		{"invalid, from the request's field", "", statusErr(codes.InvalidArgument, keyViolation("the request's field request_id must be visible ASCII"), idemInfo(idem.ReasonKeyInvalid)),
			http.StatusBadRequest, idem.ReasonKeyInvalid, ""},
		{"missing, although a header came", "k", statusErr(codes.InvalidArgument, keyViolation("required by /pkg.Svc/M"), idemInfo(idem.ReasonKeyMissing)),
			http.StatusBadRequest, idem.ReasonKeyMissing, ""},
		// A server of an idem release that set no ErrorInfo on key errors.
		{"a violation alone", "", statusErr(codes.InvalidArgument, keyViolation("must not be empty")),
			http.StatusBadRequest, idem.ReasonKeyInvalid, ""},
		{"another domain", "k", statusErr(codes.FailedPrecondition, &errdetails.ErrorInfo{Reason: idem.ReasonKeyReused, Domain: "example.com"}),
			http.StatusBadRequest, "", ""},
		{"a reason idem does not have", "k", statusErr(codes.FailedPrecondition, idemInfo("IDEMPOTENCY_SOMETHING_ELSE")),
			http.StatusBadRequest, "", ""},
		{"another field", "", statusErr(codes.InvalidArgument, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount"}}}),
			http.StatusBadRequest, "", ""},
		{"not a status", "k", errors.New("boom"), http.StatusInternalServerError, "", ""},
		// Errors without an idem reason keep their RetryInfo as
		// Retry-After: idem's store failures and conflicts, and the
		// service's own.
		{"the store failed", "k", statusErr(codes.Unavailable, retryInfo(time.Second)),
			http.StatusServiceUnavailable, "", "1"},
		{"a conflict in the store", "k", statusErr(codes.Aborted, retryInfo(0)),
			http.StatusConflict, "", "0"},
		{"the service's own", "k", statusErr(codes.ResourceExhausted, retryInfo(2500*time.Millisecond)),
			http.StatusTooManyRequests, "", "3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v1/things", nil)
			if c.key != "" {
				req.Header.Set(idem.HTTPKeyHeader, c.key)
			}
			w := httptest.NewRecorder()
			runtime.HTTPError(t.Context(), mux, &runtime.JSONPb{}, w, req, c.err)
			if w.Code != c.status || w.Header().Get("Retry-After") != c.retryAfter {
				t.Fatalf("%d, Retry-After %q; want %d, %q", w.Code, w.Header().Get("Retry-After"), c.status, c.retryAfter)
			}
			if c.reason == "" {
				if ct := w.Header().Get("Content-Type"); ct != "application/json" {
					t.Fatalf("Content-Type %q; want grpc-gateway's application/json", ct)
				}
				return
			}
			problem(t, reply{status: w.Code, header: w.Header(), body: w.Body.Bytes()}, c.status, c.reason)
		})
	}
}

// TestErrorHandlerMetadata: a problem detail carries the response metadata
// as the ServeMux's matchers forward it, the replay marker among them.
func TestErrorHandlerMetadata(t *testing.T) {
	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	ctx := runtime.NewServerMetadataContext(context.Background(), runtime.ServerMetadata{
		HeaderMD: metadata.Pairs(idem.ReplayedHeader, "true", "x-request-id", "r-1"),
	})
	req := httptest.NewRequest(http.MethodPost, "/v1/things", nil)
	req.Header.Set(idem.HTTPKeyHeader, "k")
	w := httptest.NewRecorder()
	runtime.HTTPError(ctx, mux, &runtime.JSONPb{}, w, req, statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonKeyReused)))
	if w.Code != http.StatusUnprocessableEntity || w.Header().Get(idem.HTTPReplayedHeader) != "true" ||
		w.Header().Get("Grpc-Metadata-X-Request-Id") != "r-1" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
	var p map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p["reason"] != idem.ReasonKeyReused || len(p) != 5 {
		t.Fatalf("body %s (%v); want the problem detail alone", w.Body, err)
	}
}

// TestErrorHandlerNext: idem's errors are answered even when the next
// handler writes nothing; other errors are its own.
func TestErrorHandlerNext(t *testing.T) {
	var others []error
	h := idemgateway.ErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, err error) {
		others = append(others, err)
	})
	mux := runtime.NewServeMux()
	req := httptest.NewRequest(http.MethodPost, "/v1/things", nil)
	w := httptest.NewRecorder()
	h(t.Context(), mux, &runtime.JSONPb{}, w, req, statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonKeyReused)))
	problem(t, reply{status: w.Code, header: w.Header(), body: w.Body.Bytes()}, http.StatusUnprocessableEntity, idem.ReasonKeyReused)

	other := status.Error(codes.NotFound, "no such thing")
	h(t.Context(), mux, &runtime.JSONPb{}, httptest.NewRecorder(), req, other)
	if len(others) != 2 || others[1] != other {
		t.Fatalf("next got %v; want idem's error (for the headers) and the other one", others)
	}
}
