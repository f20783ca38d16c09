// Package grpctest serves the transport conformance suite's test service
// with grpc-go and calls it: the harness of the gRPC adapter (package
// interceptor), and the gRPC server behind the gateway's. It is not public
// API.
package grpctest

import (
	"context"
	"iter"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/transport/transporttest"
)

// Harness is the suite's harness of grpc-go with idem's interceptors.
type Harness struct{}

// Serve serves the test service with h behind the interceptors on e and
// returns a client of it.
func (Harness) Serve(t *testing.T, e *idem.Engine, h transporttest.Handler) transporttest.Client {
	t.Helper()
	return Client{Conn: Dial(t, Serve(t, e, h))}
}

// Outgoing returns a client of c's server through idem's client
// interceptor built with opts.
func (Harness) Outgoing(t *testing.T, c transporttest.Client, opts ...idem.ClientOption) transporttest.Client {
	t.Helper()
	target := c.(Client).Conn.(*grpc.ClientConn).Target()
	return Client{Conn: Dial(t, target, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor(opts...)))}
}

// Serve serves the test service with h on 127.0.0.1 behind idem's server
// interceptors on e, and returns its address.
func Serve(t *testing.T, e *idem.Engine, h transporttest.Handler) string {
	t.Helper()
	srv := grpc.NewServer(grpc.UnaryInterceptor(interceptor.UnaryServerInterceptor(e)),
		grpc.StreamInterceptor(interceptor.StreamServerInterceptor()))
	Register(srv, h)
	return Start(t, srv)
}

// Start serves srv on 127.0.0.1 until the test ends, and returns its
// address.
func Start(t *testing.T, srv *grpc.Server) string {
	t.Helper()
	lis := idemtest.Listen(t)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// Dial returns a connection to target, closed when the test ends.
func Dial(t *testing.T, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Register registers the unary methods of the suite's test service on s,
// each handled by h, from the service's descriptor, as generated code
// would: the request decoded into its registered Go type and handed
// through s's interceptors.
func Register(s grpc.ServiceRegistrar, h transporttest.Handler) {
	sd := transporttest.Service()
	desc := &grpc.ServiceDesc{ServiceName: string(sd.FullName()), HandlerType: (*any)(nil)}
	for full, md := range UnaryMethods() {
		desc.Methods = append(desc.Methods, grpc.MethodDesc{
			MethodName: string(md.Name()),
			Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				req := NewMessage(md.Input())
				if err := dec(req); err != nil {
					return nil, err
				}
				handler := func(ctx context.Context, req any) (any, error) {
					return answer(ctx, h(ctx, full, req.(proto.Message)))
				}
				if ic == nil {
					return handler(ctx, req)
				}
				return ic(ctx, req, &grpc.UnaryServerInfo{FullMethod: full}, handler)
			},
		})
	}
	s.RegisterService(desc, struct{}{})
}

// UnaryMethods yields the unary methods of the suite's test service, by
// full method name.
func UnaryMethods() iter.Seq2[string, protoreflect.MethodDescriptor] {
	return func(yield func(string, protoreflect.MethodDescriptor) bool) {
		sd := transporttest.Service()
		methods := sd.Methods()
		for i := range methods.Len() {
			md := methods.Get(i)
			if md.IsStreamingClient() || md.IsStreamingServer() {
				continue
			}
			if !yield("/"+string(sd.FullName())+"/"+string(md.Name()), md) {
				return
			}
		}
	}
}

// answer sends r as a gRPC handler does.
func answer(ctx context.Context, r transporttest.Reply) (any, error) {
	if len(r.Header) > 0 {
		if err := grpc.SetHeader(ctx, metadata.MD(r.Header)); err != nil {
			return nil, err
		}
	}
	if len(r.Trailer) > 0 {
		if err := grpc.SetTrailer(ctx, metadata.MD(r.Trailer)); err != nil {
			return nil, err
		}
	}
	if r.Status != nil {
		return nil, status.ErrorProto(r.Status)
	}
	return r.Message, nil
}

// NewMessage returns a new message of the registered Go type of md, a
// message of the suite's test service.
func NewMessage(md protoreflect.MessageDescriptor) proto.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		panic(err) // the suite's package registers every type of its service
	}
	return mt.New().Interface()
}

// Client is the suite's client over gRPC.
type Client struct {
	Conn grpc.ClientConnInterface
}

// Call makes r over gRPC: the keys and the header as metadata.
func (c Client) Call(ctx context.Context, r transporttest.Request) (transporttest.Response, error) {
	md := metadata.MD{}
	for _, k := range r.Keys {
		md.Append(idem.KeyHeader, k)
	}
	for k, v := range r.Header {
		md.Append(k, v)
	}
	ctx = metadata.NewOutgoingContext(ctx, metadata.Join(md, outgoing(ctx)))
	codec := NewRawCodec()
	var header, trailer metadata.MD
	err := c.Conn.Invoke(ctx, r.Method, r.Message, r.Response, grpc.Header(&header), grpc.Trailer(&trailer), grpc.ForceCodecV2(codec))
	resp := transporttest.Response{
		Header:   header,
		Trailer:  trailer,
		Replayed: strings.Join(header.Get(idem.ReplayedHeader), ",") == "true",
	}
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			return resp, err
		}
		resp.Err = transporttest.ErrorFromStatus(st.Proto())
		return resp, nil
	}
	resp.Message, resp.Body = r.Response, codec.Last()
	return resp, nil
}

// outgoing returns the outgoing metadata of ctx, if any.
func outgoing(ctx context.Context) metadata.MD {
	md, _ := metadata.FromOutgoingContext(ctx)
	return md
}

// RawCodec is the binary protobuf codec, which keeps the bytes of the
// last message it decoded, so that a test can compare what crossed the
// wire: give it to a call with grpc.ForceCodecV2.
type RawCodec struct {
	encoding.CodecV2
	mu   sync.Mutex
	seen []byte
}

// NewRawCodec returns a RawCodec.
func NewRawCodec() *RawCodec { return &RawCodec{CodecV2: encoding.GetCodecV2("proto")} }

// Unmarshal keeps data and decodes it into v.
func (c *RawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.mu.Lock()
	c.seen = data.Materialize()
	c.mu.Unlock()
	return c.CodecV2.Unmarshal(data, v)
}

// Last returns the bytes of the last message decoded.
func (c *RawCodec) Last() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen
}
