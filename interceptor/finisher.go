package interceptor

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transport"
)

// FinisherRegistrar returns a grpc.ServiceRegistrar that registers the
// unary methods of the services registered with it with f, as a
// grpc.Server registers them, so that f can run their abandoned calls
// again: register the same implementations with it as with the server.
//
//	f, err := idem.NewFinisher(engine)
//	paymentsv1.RegisterPaymentServiceServer(interceptor.FinisherRegistrar(f), svc)
//	go f.Run(ctx)
//
// A run goes through interceptors, in the order given, then through idem's
// server interceptor, as on the server; without them no other interceptor
// runs. The context carries a grpc.ServerTransportStream: grpc.Method
// reports the method, and grpc.SetHeader, grpc.SendHeader and
// grpc.SetTrailer work; the metadata set is recorded with the outcome and
// replayed to a retry, as on a call the server receives. The incoming
// metadata is what was kept with the call ([idem.MethodPolicy].FinishHeaders) and
// its key. What still differs: there is no peer (peer.FromContext reports
// none), no credentials and no transport, so nothing is sent; the deadline
// is the attempt's bound, not a client's; and the server's stats handlers
// (otelgrpc's spans, say) do not see the run.
func FinisherRegistrar(f *idem.Finisher, interceptors ...grpc.UnaryServerInterceptor) grpc.ServiceRegistrar {
	return &registrar{f: f, interceptors: interceptors}
}

type registrar struct {
	f            *idem.Finisher
	interceptors []grpc.UnaryServerInterceptor
}

func (r *registrar) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, md := range desc.Methods {
		method := "/" + desc.ServiceName + "/" + md.MethodName
		handler := md.Handler
		transport.RegisterFinish(r.f, method, func(ctx context.Context, e *idem.Engine, req proto.Message, header map[string][]string) error {
			chain := append(append([]grpc.UnaryServerInterceptor(nil), r.interceptors...), UnaryServerInterceptor(e))
			ctx = metadata.NewIncomingContext(ctx, metadata.MD(header))
			ctx = grpc.NewContextWithServerTransportStream(ctx, &finishStream{method: method})
			dec := func(v any) error {
				m, ok := v.(proto.Message)
				if !ok {
					return status.Errorf(codes.Internal, "idem: the request is a %T, not a protobuf message", v)
				}
				proto.Merge(m, req)
				return nil
			}
			_, err := handler(impl, ctx, dec, chained(chain))
			return err
		})
	}
}

// chained runs ics as one interceptor, the first outermost.
func chained(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return ics[0](ctx, req, info, chainedHandler(ics, 0, info, handler))
	}
}

func chainedHandler(ics []grpc.UnaryServerInterceptor, i int, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) grpc.UnaryHandler {
	if i == len(ics)-1 {
		return handler
	}
	return func(ctx context.Context, req any) (any, error) {
		return ics[i+1](ctx, req, info, chainedHandler(ics, i+1, info, handler))
	}
}

// finishStream is the grpc.ServerTransportStream of a call a finisher runs:
// it keeps the metadata the handler sets, which idem records, and sends
// nothing.
type finishStream struct {
	method string

	mu              sync.Mutex
	header, trailer metadata.MD
	sent            bool
}

// errHeaderSent is what grpc-go answers a SetHeader after the header went.
var errHeaderSent = status.Error(codes.Internal, "transport: the stream is done or WriteHeader was already called")

func (s *finishStream) Method() string { return s.method }

func (s *finishStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent {
		return errHeaderSent
	}
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *finishStream) SendHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent {
		return errHeaderSent
	}
	s.header = metadata.Join(s.header, md)
	s.sent = true
	return nil
}

func (s *finishStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}
