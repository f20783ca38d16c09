// Package retryhint holds the rule by which idem's clients retry a call
// with its idempotency key, whatever the transport: which answers are
// retried ([Retryable]) and how long a client waits first ([Delay]). It
// reads an answer as a google.rpc.Status and imports no transport, so that
// idem's core, its grpc-go adapter (interceptor.RetryDelay and
// interceptor.BackoffRetryInfo, for go-grpc-middleware's retry interceptor
// configured with the same codes) and its connect-go adapter
// (idemconnect.NewRetryInterceptor, idemconnect.RetryDelay) read the same
// hint the same way.
package retryhint

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
)

// Retryable reports whether a client retries, with the same key, a call
// answered with code c: ABORTED (a request with the key still in flight, a
// lease taken over) and UNAVAILABLE (a server or store that failed, which
// recorded nothing), unless the answer is a replay, a recorded outcome
// that every retry gets again. Any other code is the call's answer
// (FAILED_PRECONDITION for a key reused with another request,
// INVALID_ARGUMENT for a malformed or missing key, a handler's own error),
// as are CANCELED and DEADLINE_EXCEEDED, which end the caller's wait.
func Retryable(c code.Code, replayed bool) bool {
	return !replayed && (c == code.Code_ABORTED || c == code.Code_UNAVAILABLE)
}

// Delay returns the delay the google.rpc.RetryInfo detail of st asks for
// before a retry (a negative one as 0), and whether st has one.
func Delay(st *spb.Status) (time.Duration, bool) {
	for _, a := range st.GetDetails() {
		var ri errdetails.RetryInfo
		if a.MessageIs(&ri) && a.UnmarshalTo(&ri) == nil && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
