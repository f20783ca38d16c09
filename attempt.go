package idem

// attempt is what a call's client says of it: a first attempt of its key,
// a retry, or nothing.
type attempt uint8

const (
	unmarked attempt = iota
	firstAttempt
	retryAttempt
)

// The request metadata of gRPC's retries, which mark a call as a retry.
const (
	// previousAttemptsHeader is set by grpc-go's retryPolicy, to the number
	// of attempts made before, on every attempt after the first.
	previousAttemptsHeader = "grpc-previous-rpc-attempts"
	// retryAttemptHeader is set by go-grpc-middleware v2's retry
	// interceptor (retry.AttemptMetadataKey), to the attempt's number, on
	// every attempt after the first.
	retryAttemptHeader = "x-retry-attempt"
)

// attemptOf returns what the request metadata header (lower-case names)
// says of a call. A retry is marked by grpc-previous-rpc-attempts above
// 0, by x-retry-attempt, or by [AttemptHeader] above 1; a first attempt by
// AttemptHeader 1, alone, and no mark of a retry (grpc-go's retryPolicy
// resends the first attempt's metadata, adding its own). Anything else,
// malformed values included, is unmarked: the mark only chooses how a
// claim starts, so it is never an error.
func attemptOf(header map[string][]string) attempt {
	for _, v := range header[previousAttemptsHeader] {
		if n, ok := count(v); ok && n > 0 {
			return retryAttempt
		}
	}
	if len(header[retryAttemptHeader]) > 0 {
		return retryAttempt
	}
	values := header[AttemptHeader]
	for _, v := range values {
		if n, ok := count(v); ok && n > 1 {
			return retryAttempt
		}
	}
	if len(values) == 1 {
		if n, ok := count(values[0]); ok && n == 1 {
			return firstAttempt
		}
	}
	return unmarked
}

// count parses v as a non-negative decimal integer of at most 9 digits.
func count(v string) (int, bool) {
	if v == "" || len(v) > 9 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}
