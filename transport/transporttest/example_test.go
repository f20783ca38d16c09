package transporttest_test

import (
	"context"
	"errors"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transport"
	"github.com/idemkit/idem/transport/transporttest"
)

// inProcess is the shortest adapter there is: it hands each call to the
// engine in the caller's process, with no wire between. Its harness shows
// what a harness does; a real one starts a server of its wire and calls it.
type inProcess struct {
	e *idem.Engine
	h transporttest.Handler
	// keys, when set, keys the calls as a client adapter does.
	keys *transport.OutgoingKeys
}

// serve is the harness: the adapter on e, in front of h.
func serve(_ *testing.T, e *idem.Engine, h transporttest.Handler) transporttest.Client {
	return inProcess{e: e, h: h}
}

// Call maps r to a transport.Call, as an adapter maps a request of its
// wire, and the answer back to a Response.
func (c inProcess) Call(ctx context.Context, r transporttest.Request) (transporttest.Response, error) {
	msg, keys := proto.Message(r.Message), r.Keys
	header := map[string][]string{}
	for k, v := range r.Header {
		header[k] = []string{v}
	}
	if c.keys != nil {
		send, sent, first, err := c.keys.For(ctx, r.Method, r.Message, r.Keys)
		if err != nil {
			return transporttest.Response{}, err
		}
		msg, keys = send.(proto.Message), sent
		if _, set := header[idem.AttemptHeader]; first && !set {
			header[idem.AttemptHeader] = []string{"1"} // a first attempt
		}
	}
	// The handler runs with a context of its own, as on a server.
	call := transport.Call{Method: r.Method, Keys: keys, Request: msg, Header: header, Status: statusOf}
	// What the handler set goes out as it set it; the answer adds idem's
	// metadata, and on a replay the recorded.
	var set transporttest.Reply
	ans, err := transport.Handle(context.WithoutCancel(ctx), c.e, call, func(ctx context.Context) (transport.Reply, error) {
		set = c.h(ctx, r.Method, msg)
		rep := transport.Reply{Message: set.Message, Header: set.Header, Trailer: set.Trailer}
		if set.Status != nil {
			return transport.Reply{Header: set.Header, Trailer: set.Trailer}, statusError{set.Status}
		}
		return rep, nil
	})
	resp := transporttest.Response{Header: merge(set.Header, ans.Header), Trailer: merge(set.Trailer, ans.Trailer)}
	resp.Replayed = len(ans.Header[idem.ReplayedHeader]) == 1 && ans.Header[idem.ReplayedHeader][0] == "true"
	if ie := (*idem.Error)(nil); errors.As(err, &ie) {
		resp.Err = transporttest.ErrorFromStatus(ie.Status())
		return resp, nil
	}
	if st, ok := statusOf(err); ok {
		resp.Err = transporttest.ErrorFromStatus(st)
		return resp, nil
	}
	if err != nil {
		return resp, err
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(ans.WireMessage())
	if err != nil {
		return resp, err
	}
	if err := proto.Unmarshal(body, r.Response); err != nil {
		return resp, err
	}
	resp.Message, resp.Body = r.Response, body
	return resp, nil
}

// merge returns the metadata of a and b.
func merge(a, b map[string][]string) map[string][]string {
	md := map[string][]string{}
	for _, m := range []map[string][]string{a, b} {
		for k, v := range m {
			md[k] = append(md[k], v...)
		}
	}
	return md
}

// statusError is an error of the handler's, as the wire's errors carry a
// status.
type statusError struct{ st *spb.Status }

func (e statusError) Error() string { return e.st.GetMessage() }

// statusOf reads the status of the wire's errors, for the engine.
func statusOf(err error) (*spb.Status, bool) {
	if se := (statusError{}); errors.As(err, &se) {
		return se.st, true
	}
	return nil, false
}

// harness is the harness of the adapter's client side.
type harness struct{}

func (harness) Serve(t *testing.T, e *idem.Engine, h transporttest.Handler) transporttest.Client {
	return serve(t, e, h)
}

func (harness) Outgoing(_ *testing.T, c transporttest.Client, opts ...idem.ClientOption) transporttest.Client {
	ip := c.(inProcess)
	ip.keys = transport.NewOutgoingKeys(opts...)
	return ip
}

// An adapter's test runs the suite with a harness that serves the suite's
// service through the adapter.
func ExampleRun() {
	testConformance := func(t *testing.T) { // func TestConformance(t *testing.T)
		transporttest.Run(t, transporttest.HarnessFunc(serve))
	}
	_ = testConformance
}

// TestInProcess: the engine itself, behind the in-process adapter, passes
// the suite, the outgoing cases included.
func TestInProcess(t *testing.T) {
	transporttest.Run(t, harness{})
}
