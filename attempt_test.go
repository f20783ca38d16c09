package idem

import (
	"context"
	"testing"

	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
)

// TestAttemptOf: the marks of a first attempt and of a retry, a retry's
// winning over a first attempt's, and anything malformed unmarked.
func TestAttemptOf(t *testing.T) {
	for _, c := range []struct {
		name   string
		header map[string][]string
		want   attempt
	}{
		{"none", nil, unmarked},
		{"other headers", map[string][]string{"idempotency-key": {"k"}}, unmarked},
		{"first", map[string][]string{AttemptHeader: {"1"}}, firstAttempt},
		{"first, leading zero", map[string][]string{AttemptHeader: {"01"}}, firstAttempt},
		{"second", map[string][]string{AttemptHeader: {"2"}}, retryAttempt},
		{"tenth", map[string][]string{AttemptHeader: {"10"}}, retryAttempt},
		{"zero", map[string][]string{AttemptHeader: {"0"}}, unmarked},
		{"empty", map[string][]string{AttemptHeader: {""}}, unmarked},
		{"no values", map[string][]string{AttemptHeader: {}}, unmarked},
		{"negative", map[string][]string{AttemptHeader: {"-1"}}, unmarked},
		{"plus sign", map[string][]string{AttemptHeader: {"+1"}}, unmarked},
		{"spaces", map[string][]string{AttemptHeader: {" 1"}}, unmarked},
		{"not a number", map[string][]string{AttemptHeader: {"first"}}, unmarked},
		{"a list in one value", map[string][]string{AttemptHeader: {"1, 1"}}, unmarked},
		{"too long", map[string][]string{AttemptHeader: {"1000000000"}}, unmarked},
		{"two firsts", map[string][]string{AttemptHeader: {"1", "1"}}, unmarked},
		{"a first and a retry", map[string][]string{AttemptHeader: {"1", "3"}}, retryAttempt},
		{"a malformed value and a retry", map[string][]string{AttemptHeader: {"x", "2"}}, retryAttempt},
		{"grpc-go's retry", map[string][]string{previousAttemptsHeader: {"1"}}, retryAttempt},
		{"grpc-go's retry of a first attempt", map[string][]string{AttemptHeader: {"1"}, previousAttemptsHeader: {"2"}}, retryAttempt},
		{"grpc-go's first attempt, never sent", map[string][]string{AttemptHeader: {"1"}, previousAttemptsHeader: {"0"}}, firstAttempt},
		{"grpc-go's, malformed", map[string][]string{AttemptHeader: {"1"}, previousAttemptsHeader: {"x"}}, firstAttempt},
		{"go-grpc-middleware's retry", map[string][]string{retryAttemptHeader: {"1"}}, retryAttempt},
		{"go-grpc-middleware's retry of a first attempt", map[string][]string{AttemptHeader: {"1"}, retryAttemptHeader: {"2"}}, retryAttempt},
	} {
		if got := attemptOf(c.header); got != c.want {
			t.Errorf("%s: attemptOf(%q) = %d, want %d", c.name, c.header, got, c.want)
		}
	}
}

// TestOutgoingFirstAttempt: a client marks as a first attempt a call
// whose key it made: a new key, or the child key of a request marked as a
// first attempt; never a key the caller chose, nor the child key of a
// request marked as a retry, or not marked.
func TestOutgoingFirstAttempt(t *testing.T) {
	k := newOutgoingKeys(WithKeyedMethods(func(context.Context, string) bool { return true }))
	method := testv1.TestService_Maybe_FullMethodName
	parent := store.Scope{Tenant: "t", Method: "/p.S/M", Key: "parent"}
	in := func(header map[string][]string) context.Context {
		return withRequestKey(context.Background(), parent, header)
	}
	for _, c := range []struct {
		name string
		ctx  context.Context
		sent []string
		want bool
	}{
		{"new key", context.Background(), nil, true},
		{"caller's key", context.Background(), []string{"mine"}, false},
		{"ContextWithKey", ContextWithKey(context.Background(), "mine"), nil, false},
		{"child of a first attempt", in(map[string][]string{AttemptHeader: {"1"}}), nil, true},
		{"child of a retry", in(map[string][]string{AttemptHeader: {"2"}}), nil, false},
		{"child of grpc-go's retry", in(map[string][]string{AttemptHeader: {"1"}, previousAttemptsHeader: {"1"}}), nil, false},
		{"child of an unmarked request", in(nil), nil, false},
		{"child, the parent's key forwarded", in(map[string][]string{AttemptHeader: {"1"}}), []string{"parent"}, true},
	} {
		_, keys, first, err := k.keysFor(c.ctx, method, nil, c.sent)
		if err != nil || len(keys) != 1 || first != c.want {
			t.Errorf("%s: keys %q, first %v, %v; want one key, first %v", c.name, keys, first, err, c.want)
		}
	}
}
