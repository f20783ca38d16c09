package idem

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/store"
)

// Metadata keys and HTTP headers of idem.
const (
	// KeyHeader is the request metadata key that carries the idempotency
	// key: exactly one value of 1 to 255 visible ASCII characters
	// (0x21 to 0x7E). A UUID is a good key.
	KeyHeader = "idempotency-key"
	// ReplayedHeader is the response header set to "true" when the response
	// is a replay of a recorded one.
	ReplayedHeader = "idempotent-replayed"
	// ExpiresHeader is the response header that says, on the first answer
	// and every replay, when the key stops counting: RFC 3339, UTC (for
	// example 2026-12-01T20:15:04Z). A retry after it runs the call again.
	ExpiresHeader = "idempotency-key-expires"
	// AttemptHeader is the request metadata key by which a client says
	// which attempt of its key a call is: a decimal integer, 1 for the
	// first attempt, 2 or more for a retry. A method in [ModeAuto] claims
	// the key of a first attempt without reading it first; a retry, a call
	// without the header and one whose value is not such an integer, as in
	// [ModeAtomic]. Retries marked by gRPC's own headers
	// (grpc-previous-rpc-attempts, go-grpc-middleware's x-retry-attempt)
	// count as retries whatever this header says. It is a hint for speed
	// only: a wrong value never changes a call's outcome. idem's client
	// adapters set it.
	AttemptHeader = "idempotency-attempt"

	// HTTPKeyHeader carries the idempotency key of an HTTP request (Connect,
	// a grpc-gateway), as draft-ietf-httpapi-idempotency-key-header names
	// it.
	HTTPKeyHeader = "Idempotency-Key"
	// HTTPReplayedHeader is set to "true" on a replayed HTTP response.
	HTTPReplayedHeader = "Idempotent-Replayed"
	// HTTPAttemptHeader is [AttemptHeader] as an HTTP client sends it
	// (Connect, a grpc-gateway): Idempotency-Attempt: 1 on the first
	// request of a key, 2 on the next, and so on.
	HTTPAttemptHeader = "Idempotency-Attempt"
)

// validateKey reports whether key is an acceptable idempotency key: 1 to
// [store.MaxKeyLength] (255) bytes, each visible ASCII (0x21 to 0x7E). Its
// error says what is wrong, without the key. It is transport.ValidateKey.
func validateKey(key string) error {
	if key == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(key) > store.MaxKeyLength {
		return fmt.Errorf("must be at most %d bytes, got %d", store.MaxKeyLength, len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("must be visible ASCII (0x21-0x7E), got byte 0x%02x at offset %d", c, i)
		}
	}
	return nil
}

type keyCtxKey struct{}

// KeyFromContext returns the validated idempotency key of the request being
// handled. It reports false outside a keyed request.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := requestKey(ctx)
	return k.Key, ok
}

// requestKey returns the scope of the keyed request handled in ctx: its
// tenant, method and key.
func requestKey(ctx context.Context) (store.Scope, bool) {
	k, ok := ctx.Value(keyCtxKey{}).(store.Scope)
	return k, ok
}
