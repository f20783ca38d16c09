package interceptor

import (
	"crypto/sha256"
	"encoding/hex"
)

// DeriveKey returns the idempotency key of a call made on behalf of the
// keyed request parent, as one named step of it: the hex-encoded SHA-256 of
// parent + ":" + step (64 characters, a valid key).
//
// A retried parent derives the same child keys, so the services it calls
// deduplicate too; two steps of one request never share a key, and the
// parent key itself is never forwarded. The client interceptor derives keys
// this way; DeriveKey is for other transports (HTTP, a provider's SDK).
func DeriveKey(parent, step string) string {
	h := sha256.New()
	h.Write([]byte(parent))
	h.Write([]byte{':'})
	h.Write([]byte(step))
	return hex.EncodeToString(h.Sum(nil))
}
