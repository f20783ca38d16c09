package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"github.com/idemkit/idem/store"
)

// stepKey returns the idempotency key of the call that the keyed request
// parent (its whole scope: tenant, method or its scope name, key) makes as
// its step named step: the hex-encoded SHA-256 of parent.Tenant,
// parent.Method, parent.Key and step, as [ChildKey] documents it. A call
// that names no step is keyed by its method and ordinal instead (callKey),
// from a tuple of six parts, the fourth the word "call", which never hashes
// like stepKey's four: a step may be named anything, a method name and
// "#1" included, and still never share a key with a call.
func stepKey(parent store.Scope, step string) string {
	return deriveKey(parent.Tenant, parent.Method, parent.Key, step)
}

// callKey returns the key of the n-th call (from 1) to method that the
// keyed request parent makes without naming a step: the hex-encoded SHA-256
// of parent.Tenant, parent.Method, parent.Key, "call", method and n in
// decimal, each written as stepKey writes its parts. Its six parts set it
// apart from every key stepKey derives from four: a sequence of
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

// ChildKey returns the idempotency key of the step named step of the keyed
// request handled in ctx; it reports false outside a keyed request. The
// key is the hex-encoded SHA-256 (64 characters, a valid key) of the
// request's tenant, method (its full name, or the name its option
// (idem.v1.method).scope gives) and key, and step, in that order, each
// written as its length in bytes (a big-endian uint64) followed by its
// bytes, so that no two tuples hash alike. A retried request derives the
// same child keys, so the services it calls deduplicate too; the same key
// sent by two tenants, or to two methods, names two operations, and their
// children differ; so do two steps of one request.
//
// It is the key that the outgoing calls of a [Step] named step carry
// through a client adapter. Send it yourself for other calls that must
// keep their key across retries of the request: through a client adapter
// with [ContextWithKey] (calls whose order may vary between runs of the
// handler, such as concurrent ones, which the per-method ordinal of
// "Calling other services" would hand each other's keys), or in the header
// of another transport (HTTP, a provider's SDK). Give each distinct
// operation its own step: two calls with one key are one operation, and
// the second is answered with the first's response.
func ChildKey(ctx context.Context, step string) (string, bool) {
	k, ok := requestKey(ctx)
	if !ok {
		return "", false
	}
	return stepKey(k, step), true
}
