package interceptor

import (
	"context"
	"strconv"
	"sync"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transport"
)

// pushbackTrailer is the trailer in which idem tells grpc-go's retry policy
// how long to wait, in milliseconds, when its answer carries a RetryInfo
// (the key in use, a lost lease, a store failure): grpc-go's transparent
// and policy retries honour it (gRFC A6).
const pushbackTrailer = "grpc-retry-pushback-ms"

// UnaryServerInterceptor returns a server interceptor that runs each keyed
// unary call through e: once per key, its recorded outcome replayed to
// retries. See the package documentation for the flow and the status
// codes.
func UnaryServerInterceptor(e *idem.Engine) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return serve(ctx, e, info.FullMethod, req, handler)
	}
}

// serve runs one call through e and maps its answer to gRPC.
func serve(ctx context.Context, e *idem.Engine, method string, req any, handler grpc.UnaryHandler) (any, error) {
	msg, _ := req.(proto.Message)
	md, _ := metadata.FromIncomingContext(ctx)
	call := transport.Call{
		Method:  method,
		Keys:    md.Get(idem.KeyHeader),
		Request: msg,
		Header:  md,
		Status:  grpcStatus,
	}
	ans, err := transport.Handle(ctx, e, call, func(ctx context.Context) (transport.Reply, error) {
		cs := &capturingStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx)}
		if cs.ServerTransportStream != nil {
			ctx = grpc.NewContextWithServerTransportStream(ctx, cs)
		}
		resp, err := handler(ctx, req)
		r := transport.Reply{Header: cs.header, Trailer: cs.trailer}
		if err != nil {
			return r, err
		}
		if r.Message, _ = resp.(proto.Message); r.Message == nil {
			return r, status.Errorf(codes.Internal, "idem: response is %T, not a protobuf message", resp)
		}
		return r, nil
	})
	trailer := metadata.MD(ans.Trailer)
	if ie, ok := err.(*idem.Error); ok {
		err = status.ErrorProto(ie.Status())
		if d, ok := ie.RetryDelay(); ok {
			trailer = metadata.Join(trailer, metadata.Pairs(pushbackTrailer, strconv.FormatInt(d.Milliseconds(), 10)))
		}
	}
	// SetHeader and SetTrailer fail only outside a gRPC server, and after
	// the header was sent, which the handler controls.
	if len(ans.Header) > 0 {
		_ = grpc.SetHeader(ctx, ans.Header)
	}
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	// The logging interceptor of go-grpc-middleware v2 keeps its fields in
	// the context it hands down the chain and reads them back for its
	// "finished call" line: AddFields updates them there (InjectFields
	// would make a new context, which that line never sees). Without a
	// logging interceptor before idem there are no fields to add to.
	if logging.ExtractFields(ctx) != nil {
		logging.AddFields(ctx, logging.Fields{"idem.result", string(ans.Result),
			"idem.replayed", ans.Result == idem.ResultReplayed || ans.Result == idem.ResultRebuilt})
	}
	if err != nil {
		return nil, err
	}
	return ans.WireMessage(), nil
}

// grpcStatus reads the status of a gRPC status error.
func grpcStatus(err error) (*spb.Status, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	return st.Proto(), true
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
// a streaming call that carries an idempotency key ([idem.KeyHeader]) with
// INVALID_ARGUMENT: idem makes unary calls safe to retry, and a key sent to
// a stream would otherwise be ignored without a word. Streams without a
// key pass through untouched.
func StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if len(metadata.ValueFromIncomingContext(ss.Context(), idem.KeyHeader)) > 0 {
			return status.ErrorProto(transport.StreamKeyRefused(info.FullMethod).Status())
		}
		return handler(srv, ss)
	}
}
