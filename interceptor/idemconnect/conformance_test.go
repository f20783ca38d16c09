package idemconnect_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/transport/transporttest"
)

// TestConformance runs the transport conformance suite on connect-go with
// idem's interceptors, over each protocol.
func TestConformance(t *testing.T) {
	eachProtocol(t, func(t *testing.T, p protocol) {
		transporttest.Run(t, harness{p: p})
	})
}

// harness is the suite's harness of connect-go over one protocol.
type harness struct{ p protocol }

// Serve serves the unary methods of the test service with h behind idem's
// handler interceptor on e.
func (h harness) Serve(t *testing.T, e *idem.Engine, handler transporttest.Handler) transporttest.Client {
	t.Helper()
	opt := connect.WithInterceptors(idemconnect.NewInterceptor(e))
	mux := http.NewServeMux()
	for _, route := range []struct {
		procedure string
		handler   func(string, transporttest.Handler, connect.HandlerOption) http.Handler
	}{
		{testv1.TestService_Do_FullMethodName, unaryHandler[testv1.DoRequest, testv1.DoResponse]},
		{testv1.TestService_Maybe_FullMethodName, unaryHandler[testv1.MaybeRequest, testv1.MaybeResponse]},
		{testv1.TestService_Read_FullMethodName, unaryHandler[testv1.ReadRequest, testv1.ReadResponse]},
	} {
		mux.Handle(route.procedure, route.handler(route.procedure, handler, opt))
	}
	return conformanceClient{p: h.p, url: serveMux(t, mux)}
}

// Outgoing returns a client of c's server through idem's client
// interceptor built with opts.
func (h harness) Outgoing(_ *testing.T, c transporttest.Client, opts ...idem.ClientOption) transporttest.Client {
	cc := c.(conformanceClient)
	cc.ics = []connect.Interceptor{idemconnect.NewClientInterceptor(opts...)}
	return cc
}

// unaryHandler serves procedure with h, as a connect-go handler answers.
func unaryHandler[Req, Res any](procedure string, h transporttest.Handler, opt connect.HandlerOption) http.Handler {
	return connect.NewUnaryHandler(procedure, func(ctx context.Context, req *connect.Request[Req]) (*connect.Response[Res], error) {
		r := h(ctx, procedure, any(req.Msg).(proto.Message))
		if r.Status != nil {
			ce := connect.NewError(connect.Code(r.Status.GetCode()), errors.New(r.Status.GetMessage()))
			for _, a := range r.Status.GetDetails() {
				d, err := connect.NewErrorDetail(a)
				if err != nil {
					return nil, err
				}
				ce.AddDetail(d)
			}
			addMeta(ce.Meta(), r.Header)
			addMeta(ce.Meta(), r.Trailer)
			return nil, ce
		}
		resp := connect.NewResponse(any(r.Message).(*Res))
		addMeta(resp.Header(), r.Header)
		addMeta(resp.Trailer(), r.Trailer)
		return resp, nil
	}, opt)
}

func addMeta(h http.Header, md map[string][]string) {
	for k, vs := range md {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
}

// conformanceClient is the suite's client over one protocol.
type conformanceClient struct {
	p   protocol
	url string
	ics []connect.Interceptor
}

func (c conformanceClient) Call(ctx context.Context, r transporttest.Request) (transporttest.Response, error) {
	switch r.Method {
	case testv1.TestService_Do_FullMethodName:
		return callUnary[testv1.DoRequest, testv1.DoResponse](ctx, c, r)
	case testv1.TestService_Maybe_FullMethodName:
		return callUnary[testv1.MaybeRequest, testv1.MaybeResponse](ctx, c, r)
	case testv1.TestService_Read_FullMethodName:
		return callUnary[testv1.ReadRequest, testv1.ReadResponse](ctx, c, r)
	}
	return transporttest.Response{}, errors.New("no client of " + r.Method)
}

// callUnary makes r with a client of Req and Res, and reads the body the
// response came with.
func callUnary[Req, Res any](ctx context.Context, c conformanceClient, r transporttest.Request) (transporttest.Response, error) {
	// A transport of the call's own, so that its body is this call's.
	tr := h2cTransport()
	defer tr.CloseIdleConnections()
	got := &bodies{}
	hc := &http.Client{Transport: &recordingTransport{next: tr, bodies: got}}
	opts := append([]connect.ClientOption{connect.WithInterceptors(c.ics...)}, c.p.opts...)
	client := connect.NewClient[Req, Res](hc, c.url+r.Method, opts...)
	req := connect.NewRequest(any(r.Message).(*Req))
	for _, k := range r.Keys {
		req.Header().Add(idem.HTTPKeyHeader, c.p.header(k))
	}
	for k, v := range r.Header {
		req.Header().Set(k, v)
	}
	resp, err := client.CallUnary(ctx, req)
	if err != nil {
		ce := new(connect.Error)
		if !errors.As(err, &ce) || got.last() == nil { // no answer came
			return transporttest.Response{}, err
		}
		st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
		for _, d := range ce.Details() {
			v, err := d.Value()
			if err != nil {
				return transporttest.Response{}, err
			}
			a, err := anypb.New(v)
			if err != nil {
				return transporttest.Response{}, err
			}
			st.Details = append(st.Details, a)
		}
		return transporttest.Response{
			Err:      transporttest.ErrorFromStatus(st),
			Header:   lower(ce.Meta()),
			Replayed: ce.Meta().Get(idem.HTTPReplayedHeader) == "true",
		}, nil
	}
	proto.Merge(r.Response, any(resp.Msg).(proto.Message))
	return transporttest.Response{
		Message:  r.Response,
		Body:     got.last(),
		Header:   lower(resp.Header()),
		Trailer:  lower(resp.Trailer()),
		Replayed: resp.Header().Get(idem.HTTPReplayedHeader) == "true",
	}, nil
}

// lower returns h with lower-case names.
func lower(h http.Header) map[string][]string {
	md := make(map[string][]string, len(h))
	for k, v := range h {
		md[strings.ToLower(k)] = v
	}
	return md
}
