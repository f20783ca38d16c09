package transport

import (
	"context"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/bridge"
)

// OutgoingKeys decides the idempotency key of each outgoing call, for the
// client adapters of every transport: once per logical call, so that every
// retry made below the adapter carries the same key. Which methods are
// keyed and which key each call gets are the rules of idem's package
// documentation, "Calling other services", so that a client over any
// transport keys its calls alike. It is safe for concurrent use.
type OutgoingKeys struct {
	keysFor bridge.KeysFunc
}

// NewOutgoingKeys returns the OutgoingKeys of a client configured with
// opts: the options the client adapter was given.
func NewOutgoingKeys(opts ...idem.ClientOption) *OutgoingKeys {
	return &OutgoingKeys{keysFor: bridge.NewOutgoingKeys(opts)}
}

// For returns the request to send for a call of fullMethod made with ctx
// and the request message req, and the idempotency keys it carries, given
// the keys sent, which the caller put on the call itself (usually none):
// one key of idem's, or sent as it is, or sent less the key of the request
// being handled in ctx, which is never forwarded. The request to send is
// req, or, when idem's key also goes in req's empty field marked
// (idem.v1.field).key, a copy of req with the field set; req is never
// changed. When req carries its key in that field, For adds no key of
// idem's: the field's is the call's. The keys are values, decoded from
// their transport's syntax; the adapter writes them in its own. An error
// is an [*idem.Error] that fails the call before it is sent:
// INVALID_ARGUMENT for a key set with [idem.ContextWithKey] that
// [ValidateKey] refuses. Each call of For with a key counts in the metric
// idem.client.keys ([idem.WithMeterProvider]): call it once per logical
// call, and send the request it returns on every attempt.
//
// first reports that the call is, as far as the client can tell, the
// first of its key: the key is one idem made for it (a new one, or a
// child key of a request that its own client marked as a first attempt).
// The adapter then marks the call's first attempt with [idem.AttemptHeader]
// 1, unless the caller set that header itself; it sends nothing when
// first is false, since a key the caller chose may well be a retry's.
func (k *OutgoingKeys) For(ctx context.Context, fullMethod string, req any, sent []string) (send any, keys []string, first bool, err error) {
	return k.keysFor(ctx, fullMethod, req, sent)
}
