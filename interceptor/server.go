package interceptor

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/store"
)

// UnaryServerInterceptor returns a server interceptor that runs each keyed
// unary call once per key and replays its recorded outcome to retries. See
// the package documentation for the flow and the status codes. It is an
// [Engine] behind grpc-go's interceptor API.
func UnaryServerInterceptor(s store.Store, opts ...ServerOption) grpc.UnaryServerInterceptor {
	return NewEngine(s, opts...).unary()
}

// unary is the gRPC adapter of e.
func (e *Engine) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		msg, _ := req.(proto.Message)
		call := Call{
			Method:  info.FullMethod,
			Keys:    metadata.ValueFromIncomingContext(ctx, KeyHeader),
			Request: msg,
		}
		ans, err := e.Handle(ctx, call, func(ctx context.Context) (Reply, error) {
			cs := &capturingStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx)}
			if cs.ServerTransportStream != nil {
				ctx = grpc.NewContextWithServerTransportStream(ctx, cs)
			}
			resp, err := handler(ctx, req)
			r := Reply{Header: cs.header, Trailer: cs.trailer}
			if err != nil {
				return r, err
			}
			if r.Message, _ = resp.(proto.Message); r.Message == nil {
				return r, status.Errorf(codes.Internal, "idem: response is %T, not a protobuf message", resp)
			}
			return r, nil
		})
		// SetHeader and SetTrailer fail only outside a gRPC server, and
		// after the header was sent, which the handler controls.
		if len(ans.Header) > 0 {
			_ = grpc.SetHeader(ctx, ans.Header)
		}
		if len(ans.Trailer) > 0 {
			_ = grpc.SetTrailer(ctx, ans.Trailer)
		}
		if err != nil {
			return nil, err
		}
		return ans.WireMessage(), nil
	}
}

// capturingStream keeps the response metadata a handler sets, for idem to
// record with its outcome, and passes it on to the stream.
type capturingStream struct {
	grpc.ServerTransportStream

	mu              sync.Mutex
	header, trailer metadata.MD
}

func (s *capturingStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	s.header = metadata.Join(s.header, md)
	s.mu.Unlock()
	return s.ServerTransportStream.SetHeader(md)
}

func (s *capturingStream) SendHeader(md metadata.MD) error {
	s.mu.Lock()
	s.header = metadata.Join(s.header, md)
	s.mu.Unlock()
	return s.ServerTransportStream.SendHeader(md)
}

func (s *capturingStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	s.trailer = metadata.Join(s.trailer, md)
	s.mu.Unlock()
	return s.ServerTransportStream.SetTrailer(md)
}

// StreamServerInterceptor returns a stream server interceptor that refuses
// a streaming call that carries an idempotency key ([KeyHeader]) with
// INVALID_ARGUMENT: idem makes unary calls safe to retry, and a key sent to
// a stream would otherwise be ignored without a word. Streams without a
// key pass through untouched.
func StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if len(metadata.ValueFromIncomingContext(ss.Context(), KeyHeader)) > 0 {
			return invalidKey("idempotency keys apply to unary methods, and " + info.FullMethod + " streams")
		}
		return handler(srv, ss)
	}
}
