package transport

import (
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/bridge"
)

// ValidateKey reports whether key is an acceptable idempotency key: 1 to
// 255 bytes ([github.com/idemkit/idem/store.MaxKeyLength]), each visible
// ASCII (0x21 to 0x7E). Its error says what is wrong, without the key.
// The engine applies the same rule to every key a [Call] carries.
func ValidateKey(key string) error {
	return bridge.ValidateKey(key)
}

// StreamKeyRefused is the answer to a streaming call that carries an
// idempotency key: INVALID_ARGUMENT with ErrorInfo reason
// [idem.ReasonKeyInvalid], as a malformed key is, since idem makes unary
// calls safe to retry and a key sent to a stream would otherwise be
// ignored without a word. fullMethod names the method.
func StreamKeyRefused(fullMethod string) *idem.Error {
	return bridge.InvalidKey("idempotency keys apply to unary methods, and " + fullMethod + " streams").(*idem.Error)
}
