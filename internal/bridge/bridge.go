// Package bridge joins package transport, the adapter authors' API, to the
// engine of package idem without an import cycle: transport imports idem
// (its functions take an *idem.Engine), so idem cannot import transport,
// and both import this package, which imports neither.
//
// It declares the data the engine works on, with exported fields, and
// function variables typed with them, which package idem sets in an init
// function (the engine and the finisher passed as any, and asserted back
// there). Package transport declares its own documented types, copies
// them to and from these, and calls the variables. Nothing here is for
// anyone else.
package bridge

import (
	"context"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
)

// Call is one unary call as its transport received it (transport.Call).
type Call struct {
	Method   string
	Keys     []string
	KeyError error
	Request  proto.Message
	Header   map[string][]string
	Status   func(error) (*spb.Status, bool)
}

// Reply is what a handler answered (transport.Reply).
type Reply struct {
	Message         proto.Message
	Header, Trailer map[string][]string
}

// Handler runs the handler of a call. It is an interface, not a func, so
// that package transport hands the engine its own handler func type,
// which implements it, with no closure to allocate on every call (a func
// value converts to an interface without allocating).
type Handler interface {
	Run(ctx context.Context) (Reply, error)
}

// Answer is what the transport sends back for a call (transport.Answer).
// Result is an idem.Result; Wire is what a binary protobuf codec sends,
// when it differs from Message.
type Answer struct {
	Message         proto.Message
	Header, Trailer map[string][]string
	Result          string
	Wire            proto.Message
}

// FinishFunc runs an abandoned call again through engine, an *idem.Engine
// (transport.FinishFunc).
type FinishFunc func(ctx context.Context, engine any, req proto.Message, header map[string][]string) error

// KeysFunc decides the request and the keys of an outgoing call
// (transport.OutgoingKeys.For).
type KeysFunc func(ctx context.Context, fullMethod string, req any, sent []string) (any, []string, bool, error)

// The engine's entry points, set by package idem.
var (
	// Handle runs call through engine, an *idem.Engine.
	Handle func(ctx context.Context, engine any, call Call, h Handler) (Answer, error)
	// RegisterFinish registers run with finisher, an *idem.Finisher, for
	// the calls of fullMethod.
	RegisterFinish func(finisher any, fullMethod string, run FinishFunc)
	// NewOutgoingKeys returns the keys of a client configured with opts, a
	// []idem.ClientOption.
	NewOutgoingKeys func(opts any) KeysFunc
	// ValidateKey reports whether key is an acceptable idempotency key.
	ValidateKey func(key string) error
	// InvalidKey returns idem's answer (an *idem.Error) to a call whose key
	// is malformed; reason says what is wrong with it.
	InvalidKey func(reason string) error
)
