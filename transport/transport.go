package transport

import (
	"context"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/bridge"
)

// Call is one unary call as its transport received it.
type Call struct {
	// Method is the full method name, "/pkg.Service/Method".
	Method string
	// Keys are the values of the call's idempotency key as the transport
	// carried them, decoded from its syntax (gRPC metadata
	// [idem.KeyHeader], an HTTP [idem.HTTPKeyHeader] read with
	// [ParseHTTPKey]): none when it carried none. More than one value is
	// refused.
	Keys []string
	// KeyError, when set, says why the transport could not decode the key
	// it carried from its syntax (an HTTP Idempotency-Key header that is
	// neither a Structured Field String nor a bare token, see
	// [ParseHTTPKey]). The call is refused as a key [ValidateKey] refuses
	// is, on every method, and Keys is not read.
	KeyError error
	// Request is the request message.
	Request proto.Message
	// Header is the request metadata, with lower-case names (gRPC metadata
	// as it is; HTTP headers lower-cased, -bin values decoded). The
	// tenant function ([idem.WithTenant]) reads it, and a method that may
	// be finished keeps the entries its policy names
	// ([idem.MethodPolicy].FinishHeaders).
	Header map[string][]string
	// Status reads the google.rpc.Status an error of the transport's
	// carries (a gRPC status error, a *connect.Error), and reports false
	// for an error that carries none. The engine reads the handler's
	// errors with it (to classify and record them), and passes on as they
	// are the errors that carry one from the tenant function and a
	// [idem.Loader]. Nil reads only an [*idem.Error].
	Status func(error) (*spb.Status, bool)
}

// Reply is what a handler answered: its message (nil with an error) and
// the response metadata it set, which is recorded with the outcome and
// replayed with it.
type Reply struct {
	// Message is the response (nil with an error).
	Message proto.Message
	// Header and Trailer are the response metadata the handler set, with
	// lower-case names.
	Header, Trailer map[string][]string
}

// Handler runs the handler of a call with ctx, which carries what the
// engine hands the handler (the key's transaction, its lease, its scope
// for outbound calls): run the transport's handler with it.
type Handler func(ctx context.Context) (Reply, error)

// Answer is what the transport sends back for a call, besides the error
// [Handle] returns.
type Answer struct {
	// Message is the response, decoded (nil with an error).
	Message proto.Message
	// Header and Trailer are the response metadata the engine adds to what
	// the handler set itself: the replay marker ([idem.ReplayedHeader]),
	// the key's expiry ([idem.ExpiresHeader]) and, on a replay, the
	// metadata the handler had set. Send them.
	Header, Trailer map[string][]string
	// Result is how idem ended the call.
	Result idem.Result

	// wire is Message as a binary protobuf codec must send it, when that
	// differs from Message: see WireMessage.
	wire proto.Message
}

// WireMessage returns the response to hand to a binary protobuf codec: the
// recorded bytes, exactly, for response types whose encoding is not
// canonical (maps, extensions), carried as the unknown fields of an empty
// message; Message otherwise. A transport that encodes differently (JSON)
// sends Message.
func (a Answer) WireMessage() proto.Message {
	if a.wire != nil {
		return a.wire
	}
	return a.Message
}

// Handle runs call through e: the handler h once per key, its recorded
// outcome to every retry. Its error is the handler's own, returned as the
// handler returned it, or an [*idem.Error] (the engine's own refusals, and
// a recorded error replayed), which the transport sends as its wire sends
// a google.rpc.Status. It reports the call's result to the metrics,
// traces and report hook ([idem.WithReportHook]).
//
// A run of a [idem.Finisher] reaches Handle through the [FinishFunc]
// registered for the method, with the context it was given: pass that
// context down the transport's handler chain to Handle unchanged.
func Handle(ctx context.Context, e *idem.Engine, call Call, h Handler) (Answer, error) {
	a, err := bridge.Handle(ctx, e, bridge.Call(call), runner(h))
	return Answer{Message: a.Message, Header: a.Header, Trailer: a.Trailer, Result: idem.Result(a.Result), wire: a.Wire}, err
}

// runner is a Handler as the engine runs it. A func value converts to the
// interface bridge.Handler without allocating, where a closure that
// converted the Reply would allocate on every call.
type runner Handler

func (r runner) Run(ctx context.Context) (bridge.Reply, error) {
	rep, err := r(ctx)
	return bridge.Reply(rep), err
}
