package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"github.com/idemkit/idem/store"
)

// DeriveKey returns the idempotency key of a call made on behalf of the
// keyed request parent, as one named step of it. parent is the request's
// whole scope, as the server holds it: its tenant, its full method name and
// its key. The child key is the hex-encoded SHA-256 (64 characters, a valid
// key) of parent.Tenant, parent.Method, parent.Key and step, in that order,
// each written as its length in bytes (a big-endian uint64) followed by its
// bytes, so that no two tuples hash alike.
//
// A retried parent derives the same child keys, so the services it calls
// deduplicate too. The same key sent by two tenants, or to two methods,
// names two operations, and their children differ; so do two steps of one
// request. The client interceptor derives keys this way; inside a handler,
// [ChildKey] derives them for other transports (HTTP, a provider's SDK).
//
// A call that names no step is keyed by its method and ordinal instead
// (see [OutgoingKeys]), from a tuple of six parts, the fourth the
// word "call", which never hashes like DeriveKey's four: a step may be
// named anything, a method name and "#1" included, and still never share a
// key with a call.
func DeriveKey(parent store.Scope, step string) string {
	return deriveKey(parent.Tenant, parent.Method, parent.Key, step)
}

// callKey returns the key of the n-th call (from 1) to method that the
// keyed request parent makes without naming a step: the hex-encoded SHA-256
// of parent.Tenant, parent.Method, parent.Key, "call", method and n in
// decimal, each written as DeriveKey writes its parts. Its six parts set it
// apart from every key DeriveKey derives from four: a sequence of
// length-prefixed parts encodes only itself, so a named step never hashes
// like an ordinal.
func callKey(parent store.Scope, method string, n int) string {
	return deriveKey(parent.Tenant, parent.Method, parent.Key, "call", method, strconv.Itoa(n))
}

// deriveKey returns the hex-encoded SHA-256 of parts, each written as its
// length in bytes (a big-endian uint64) followed by its bytes.
func deriveKey(parts ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, s := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ChildKey returns the idempotency key of the named step of the keyed
// request handled in ctx: [DeriveKey] of the request's tenant, method and
// key, and step. It reports false outside a keyed request. It is the key
// that calls made with [ContextWithStep](ctx, step) carry through a client
// adapter ([github.com/idemkit/idem/interceptor.UnaryClientInterceptor],
// [github.com/idemkit/idem/interceptor/idemconnect.NewClientInterceptor]);
// use it for calls over other transports (HTTP, a provider's SDK), giving
// each distinct operation its own step.
func ChildKey(ctx context.Context, step string) (string, bool) {
	k, ok := requestKey(ctx)
	if !ok {
		return "", false
	}
	return DeriveKey(k, step), true
}
