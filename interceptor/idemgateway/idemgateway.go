package idemgateway

import (
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transport"
)

// ServeMuxOptions returns the options that serve idem's contract on a
// grpc-gateway ServeMux: [KeyMiddleware], and [IncomingHeaderMatcher],
// [OutgoingHeaderMatcher] and [ErrorHandler] in front of grpc-gateway's
// defaults, and an outgoing trailer matcher that forwards the trailers as
// grpc-gateway does (as Grpc-Trailer-<key>, to a request with TE:
// trailers) but for grpc-status-details-bin: its value is the binary
// google.rpc.Status of an error, which the body carries already and which
// an HTTP trailer cannot carry (its bytes break the response, and every
// refusal of idem's has details). An option given after them replaces the matcher or error handler
// it sets; wrap yours with this package's to keep idem's part (see the
// package documentation).
func ServeMuxOptions() []runtime.ServeMuxOption {
	return []runtime.ServeMuxOption{
		runtime.WithMiddlewares(KeyMiddleware),
		runtime.WithIncomingHeaderMatcher(IncomingHeaderMatcher(nil)),
		runtime.WithOutgoingHeaderMatcher(OutgoingHeaderMatcher(nil)),
		runtime.WithErrorHandler(ErrorHandler(nil)),
		runtime.WithOutgoingTrailerMatcher(outgoingTrailerMatcher),
	}
}

// outgoingTrailerMatcher forwards each trailer key as grpc-gateway's
// default does, as Grpc-Trailer-<key>, except grpc-status-details-bin (see
// ServeMuxOptions).
func outgoingTrailerMatcher(key string) (string, bool) {
	if strings.EqualFold(key, "grpc-status-details-bin") {
		return "", false
	}
	return runtime.MetadataTrailerPrefix + key, true
}

// KeyMiddleware parses the request's Idempotency-Key header
// ([idem.HTTPKeyHeader]) with [transport.ParseHTTPKey] and passes
// the request on with the key itself as the header's value, for
// [IncomingHeaderMatcher] to hand to the gRPC server. A malformed value, or
// more than one Idempotency-Key header, is answered with 400 and a problem
// detail of reason [idem.ReasonKeyInvalid] that names what is wrong, and the
// request goes no further. A request without the header passes unchanged.
func KeyMiddleware(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
		values := r.Header.Values(idem.HTTPKeyHeader)
		if len(values) == 0 {
			next(w, r, pathParams)
			return
		}
		if len(values) > 1 {
			writeProblem(w, headerInvalid("sent "+strconv.Itoa(len(values))+" times; send exactly one"))
			return
		}
		key, err := transport.ParseHTTPKey(values[0])
		if err != nil {
			writeProblem(w, headerInvalid(err.Error()))
			return
		}
		if key != values[0] {
			r = r.Clone(r.Context())
			r.Header.Set(idem.HTTPKeyHeader, key)
		}
		next(w, r, pathParams)
	}
}

// IncomingHeaderMatcher returns an incoming header matcher that maps the
// Idempotency-Key header to idem's metadata key, idempotency-key
// ([idem.KeyHeader]), and the Idempotency-Attempt header
// ([idem.HTTPAttemptHeader]) to idempotency-attempt ([idem.AttemptHeader]),
// by which an HTTP client marks a first attempt (1) or a retry (2 and
// on), and leaves every other header to next, by
// default (nil) grpc-gateway's [runtime.DefaultHeaderMatcher], which drops
// the headers it does not know. A header that next would map to
// idempotency-key too (Grpc-Metadata-Idempotency-Key, say) is dropped: only
// Idempotency-Key, as [KeyMiddleware] parsed it, carries the key.
func IncomingHeaderMatcher(next runtime.HeaderMatcherFunc) runtime.HeaderMatcherFunc {
	if next == nil {
		next = runtime.DefaultHeaderMatcher
	}
	return func(key string) (string, bool) {
		switch textproto.CanonicalMIMEHeaderKey(key) {
		case idem.HTTPKeyHeader:
			return idem.KeyHeader, true
		case idem.HTTPAttemptHeader:
			return idem.AttemptHeader, true
		}
		name, ok := next(key)
		if ok && strings.EqualFold(name, idem.KeyHeader) {
			return "", false
		}
		return name, ok
	}
}

// OutgoingHeaderMatcher returns an outgoing header matcher that sends idem's
// response metadata under the HTTP names a Connect server sends it with
// too, and leaves the rest of the response metadata to next:
// idempotent-replayed ([idem.ReplayedHeader]) as the header
// Idempotent-Replayed ([idem.HTTPReplayedHeader]), and
// idempotency-key-expires ([idem.ExpiresHeader]) as
// Idempotency-Key-Expires. By default (nil) next does what grpc-gateway
// does by default: it forwards each key as the header Grpc-Metadata-<key>.
// next never sees idem's keys, so no Grpc-Metadata- copy of them is sent.
func OutgoingHeaderMatcher(next runtime.HeaderMatcherFunc) runtime.HeaderMatcherFunc {
	if next == nil {
		next = defaultOutgoingHeaderMatcher
	}
	return func(key string) (string, bool) {
		switch {
		case strings.EqualFold(key, idem.ReplayedHeader):
			return idem.HTTPReplayedHeader, true
		case strings.EqualFold(key, idem.ExpiresHeader):
			return httpExpiresHeader, true
		}
		return next(key)
	}
}

// httpExpiresHeader is the HTTP name of [idem.ExpiresHeader], as
// net/http (and so connect-go) writes it.
var httpExpiresHeader = textproto.CanonicalMIMEHeaderKey(idem.ExpiresHeader)

// defaultOutgoingHeaderMatcher is grpc-gateway's default outgoing header
// matcher, which it does not export.
func defaultOutgoingHeaderMatcher(key string) (string, bool) {
	return runtime.MetadataHeaderPrefix + key, true
}
