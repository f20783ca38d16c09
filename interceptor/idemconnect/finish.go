package idemconnect

import (
	"context"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transport"
)

// FinishHandler registers with f the way to run again the abandoned calls
// of procedure ("/pkg.Service/Method"), a unary Connect method served by
// fn, so that a Connect-only program has its abandoned calls finished:
//
//	f, err := idem.NewFinisher(engine)
//	idemconnect.FinishHandler(f, paymentsv1connect.PaymentServiceCreatePaymentProcedure, svc.CreatePayment)
//	go f.Run(ctx)
//
// A run calls fn through f's Engine, as NewInterceptor does, with a request
// whose header holds what was kept with the call ([idem.MethodPolicy].FinishHeaders)
// and its key; no other interceptor runs, and the request has no peer.
func FinishHandler[Req, Res any](f *idem.Finisher, procedure string, fn func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) {
	transport.RegisterFinish(f, procedure, func(ctx context.Context, e *idem.Engine, msg proto.Message, header map[string][]string) error {
		m, ok := any(msg).(*Req)
		if !ok {
			return connect.NewError(connect.CodeInternal, errFinishType(procedure, msg))
		}
		req := connect.NewRequest(m)
		// The kept header is metadata, with -bin values decoded: the
		// handler reads them encoded, as a client sent them.
		addMetadata(req.Header(), header)
		_, err := serve(ctx, e, procedure, &finishRequest{AnyRequest: req}, func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			return fn(ctx, req)
		})
		return err
	})
}

// finishRequest is the request of a finisher's run: it has no peer, and
// its key in the header is gRPC metadata's, as the finisher kept it.
type finishRequest struct {
	connect.AnyRequest
}

func (r *finishRequest) Peer() connect.Peer { return connect.Peer{Protocol: connect.ProtocolGRPC} }

func (r *finishRequest) HTTPMethod() string { return http.MethodPost }

// errFinishType is the error of a kept request that is not a request of
// the handler registered for its method.
func errFinishType(procedure string, msg proto.Message) error {
	return fmt.Errorf("idem: the request of %s is a %T, not the request type of the handler registered for it", procedure, msg)
}
