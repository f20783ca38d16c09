package interceptor

import (
	"context"
	"time"
)

// HandleMalformedKey answers a call whose transport carried an idempotency
// key that it could not decode from its syntax, such as an HTTP
// Idempotency-Key header that is neither a Structured Field String nor a
// bare token ([ParseHTTPKey]); reason says what is wrong with it. It
// answers as [Engine.Handle] answers a key that [ValidateKey] refuses:
// INVALID_ARGUMENT with a google.rpc.BadRequest violation on the key,
// nothing claimed, the handler not run, the call reported to the outcome
// hook as [ResultInvalidKey], on every method: one exempt from keys
// (IDEMPOTENT, NO_SIDE_EFFECTS), which ignores a well-formed key, refuses a
// malformed one, as Handle does. h is not run. call.Keys is not read.
func (e *Engine) HandleMalformedKey(ctx context.Context, call Call, reason error, h Handler) (Answer, error) {
	c := &callState{engine: e, method: call.Method, started: time.Now()}
	c.m = e.methods.lookup(call.Method)
	c.mode = ModeAtomic
	if c.m.leased {
		c.mode = ModeLeased
	}
	defer e.report(ctx, c)
	c.settle(ResultInvalidKey)
	return Answer{}, invalidKey(reason.Error())
}
