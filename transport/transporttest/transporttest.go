package transporttest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// Service returns the suite's test service, idem.test.v1.TestService, which
// a [Harness] serves: every unary method of it, each handled by the
// [Handler] it is given. Its Go types are registered in the global
// protobuf registry (protoregistry.GlobalTypes) by this package, so that
// a harness can build the messages of a method from its descriptor. Its
// method Do requires a key (MethodPolicy key_required) and carries it in
// the key field request_id too, and trace_id is excluded from the
// fingerprint; Maybe takes a key and needs none; Read has no side effects
// and is never keyed.
func Service() protoreflect.ServiceDescriptor {
	return testv1.File_idem_test_v1_test_proto.Services().ByName("TestService")
}

// Handler is the implementation of the test service, the suite's own: it
// counts its runs and answers as the case says. A harness serves every
// unary method of [Service] with it, through its adapter: it calls the
// Handler with the context and the request its wire's handler gets, and
// answers as the Reply says, the metadata set as the wire's handlers set
// theirs and the status sent as the wire's handlers send an error.
type Handler func(ctx context.Context, fullMethod string, req proto.Message) Reply

// Reply is what a [Handler] answers.
type Reply struct {
	// Message is the response, nil with Status.
	Message proto.Message
	// Header and Trailer are the response metadata to set, with
	// lower-case names (an HTTP wire without trailers sends Trailer as its
	// handlers' trailers go).
	Header, Trailer map[string][]string
	// Status, when set, is the error to answer with, as the wire's
	// handlers return one (a gRPC status error, a *connect.Error with its
	// details).
	Status *spb.Status
}

// Harness serves the suite's test service through one adapter. Serve
// serves every unary method of [Service] with h, behind the adapter built
// on e, on a loopback address, and returns a client that calls it over
// the wire. It registers the server's cleanup on t.
type Harness interface {
	Serve(t *testing.T, e *idem.Engine, h Handler) Client
}

// HarnessFunc is a function that is a [Harness].
type HarnessFunc func(t *testing.T, e *idem.Engine, h Handler) Client

// Serve calls f.
func (f HarnessFunc) Serve(t *testing.T, e *idem.Engine, h Handler) Client { return f(t, e, h) }

// OutgoingHarness is a [Harness] whose adapter also keys the outgoing
// calls of a client (an idem client interceptor). Outgoing returns a
// client that calls the server c calls (c is a Client that Serve
// returned) through the adapter's client side, built with opts, and sends
// no key of its own beside what that client side sends.
type OutgoingHarness interface {
	Harness
	Outgoing(t *testing.T, c Client, opts ...idem.ClientOption) Client
}

// Client calls the server of a [Harness] over its wire. Call sends r and
// returns what came back; its error is for a call that could not be made
// or whose answer could not be read, never for an error the server
// answered with, which is in the Response.
type Client interface {
	Call(ctx context.Context, r Request) (Response, error)
}

// Request is a call the suite makes.
type Request struct {
	// Method is the full method name, "/idem.test.v1.TestService/Do".
	Method string
	// Message is the request.
	Message proto.Message
	// Response is an empty message of the method's response type, to
	// decode the response into.
	Response proto.Message
	// Keys are the values of the idempotency key to send, each written in
	// the wire's syntax (gRPC metadata as it is, an HTTP header as a
	// Structured Field String); none sends no key.
	Keys []string
	// Header is the other request metadata to send, with lower-case
	// names: x-tenant-id, which names the tenant.
	Header map[string]string
}

// Response is what a [Client] got back.
type Response struct {
	// Message is Request.Response with the response decoded into it, nil
	// with an error.
	Message proto.Message
	// Body is the response message as the wire carried it, byte for byte
	// (the protobuf bytes, the HTTP body): a replay must carry the same.
	// Nil with an error.
	Body []byte
	// Err is the error the server answered with, nil for a response.
	Err *Error
	// Header and Trailer are the response metadata, with lower-case names
	// and without a wire's prefix for forwarded metadata (grpc-gateway's
	// Grpc-Metadata-): idem's, and the handler's. A wire that cannot tell
	// the handler's trailers from its headers on an error (Connect's
	// unary protocol) puts them in Header.
	Header, Trailer map[string][]string
	// Replayed reports whether the answer is marked replayed, as the wire
	// marks it ([idem.ReplayedHeader] or [idem.HTTPReplayedHeader]: true).
	Replayed bool
}

// Error is an error a server answered with, as its wire carried it.
type Error struct {
	// Code is the error's code: the gRPC code, or the code an HTTP-only
	// wire's status stands for (400 INVALID_ARGUMENT, 409 ABORTED, 422
	// FAILED_PRECONDITION for idem's refusals).
	Code code.Code
	// Message is the error's message.
	Message string
	// Reason is the reason of idem's error (a google.rpc.ErrorInfo in
	// domain [idem.Domain], or a problem detail's reason): "" for an
	// error of the handler's.
	Reason string
	// Details are the error details the wire carried (none on a wire
	// that carries none of idem's refusals' details).
	Details []proto.Message
	// RetryAfter is the wire's retry hint (google.rpc.RetryInfo's delay,
	// an HTTP Retry-After): 0 for none.
	RetryAfter time.Duration
}

// Error returns the code, reason and message.
func (e *Error) Error() string {
	return fmt.Sprintf("%v (reason %q): %s", e.Code, e.Reason, e.Message)
}

// ErrorFromStatus returns the Error of a google.rpc.Status, for a wire
// that carries one: its code, message and details, the reason of its
// ErrorInfo in domain [idem.Domain] and the delay of its RetryInfo. A
// detail that does not unmarshal is left out.
func ErrorFromStatus(st *spb.Status) *Error {
	e := &Error{Code: code.Code(st.GetCode()), Message: st.GetMessage()}
	for _, a := range st.GetDetails() {
		m, err := a.UnmarshalNew()
		if err != nil {
			continue
		}
		e.Details = append(e.Details, m)
		switch d := m.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == idem.Domain {
				e.Reason = d.GetReason()
			}
		case *errdetails.RetryInfo:
			e.RetryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	return e
}

// lockTimeout is how long a duplicate waits for the call that holds its
// key before it is answered ABORTED: short, since the in-flight case waits
// it out.
const lockTimeout = 200 * time.Millisecond

// Run runs the conformance cases against the adapter h serves, each case
// as a parallel subtest of t with an engine on a new store/memory store
// and a server of its own. The cases of outgoing keys run when h is an
// [OutgoingHarness].
func Run(t *testing.T, h Harness) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newEnv(t, h))
		})
	}
	oh, ok := h.(OutgoingHarness)
	if !ok {
		t.Logf("the outgoing cases do not apply: the harness (%T) is no OutgoingHarness", h)
		return
	}
	for _, c := range outgoingCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, oh)
		})
	}
}
