package interceptor

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemkit/idem/admin"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/internal/adminwire"
)

func init() {
	// The admin service's core reads an Authorizer's or a finished
	// handler's gRPC status through this.
	adminwire.RegisterStatus(grpcStatus)
}

// RegisterAdmin registers srv, idem's admin service
// (idem.admin.v1.AdminService, package admin), on s, as grpc-go's health
// and reflection services are registered:
//
//	s := grpc.NewServer(grpc.Creds(operatorsTLS))
//	interceptor.RegisterAdmin(s, admin.NewServer(st, authorize, opts...))
//
// The authorizer's [admin.Request] carries the call's metadata as its
// Header and, over TLS, the connection's state as its TLS. The service's
// answers ([*idem.Error]) are sent as gRPC statuses with their code,
// message and details; an authorizer's own status error as it is. The
// server's interceptors and stats handlers see the calls as those of any
// other service.
//
// The service has no generated gRPC code, so that its messages' package
// imports no grpc-go and a Connect program serves it without grpc-go
// (idemconnect.NewAdminHandler): RegisterAdmin describes it to grpc-go
// from its protobuf descriptor, which server reflection reads too.
func RegisterAdmin(s grpc.ServiceRegistrar, srv *admin.Server) {
	rpcs := map[protoreflect.Name]func(fullMethod string) grpc.MethodHandler{
		"ListKeys":    adminMethod(srv.ListKeys),
		"GetKey":      adminMethod(srv.GetKey),
		"ForgetKey":   adminMethod(srv.ForgetKey),
		"SettleKey":   adminMethod(srv.SettleKey),
		"FinishKey":   adminMethod(srv.FinishKey),
		"ListAudit":   adminMethod(srv.ListAudit),
		"GetKeyStats": adminMethod(srv.GetKeyStats),
		"ForgetKeys":  adminMethod(srv.ForgetKeys),
		"SettleKeys":  adminMethod(srv.SettleKeys),
		"FinishKeys":  adminMethod(srv.FinishKeys),
	}
	sd := adminv1.File_idem_admin_v1_admin_proto.Services().ByName("AdminService")
	desc := &grpc.ServiceDesc{
		ServiceName: string(sd.FullName()),
		HandlerType: (*any)(nil), // srv's methods are bound above
		Metadata:    sd.ParentFile().Path(),
	}
	ms := sd.Methods()
	for i := range ms.Len() {
		name := ms.Get(i).Name()
		rpc, ok := rpcs[name]
		if !ok {
			// A method added to admin.proto and not bound above: refuse to
			// serve the service without it, as the Connect handler's
			// interface does at compile time.
			panic("interceptor: RegisterAdmin has no handler for " + string(sd.FullName()) + "." + string(name))
		}
		desc.Methods = append(desc.Methods, grpc.MethodDesc{
			MethodName: string(name),
			Handler:    rpc("/" + desc.ServiceName + "/" + string(name)),
		})
	}
	s.RegisterService(desc, srv)
}

// adminMethod returns the grpc-go handler of rpc, an RPC of the admin
// service's Server, as protoc-gen-go-grpc writes one: it decodes the
// request, runs the server's interceptors, and calls rpc with the caller
// in the context and its answer as a gRPC status.
func adminMethod[Req any, PReq interface {
	*Req
	proto.Message
}, Resp any](rpc func(context.Context, PReq) (Resp, error)) func(fullMethod string) grpc.MethodHandler {
	return func(fullMethod string) grpc.MethodHandler {
		return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := PReq(new(Req))
			if err := dec(in); err != nil {
				return nil, err
			}
			handler := func(ctx context.Context, req any) (any, error) {
				resp, err := rpc(adminwire.NewContext(ctx, grpcCaller(ctx)), req.(PReq))
				if err != nil {
					return nil, grpcError(err)
				}
				return resp, nil
			}
			if ic == nil {
				return handler(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: fullMethod}, handler)
		}
	}
}

// grpcCaller returns the caller of the gRPC call ctx runs: its metadata,
// and its TLS state from the peer's credentials.
func grpcCaller(ctx context.Context) adminwire.Caller {
	md, _ := metadata.FromIncomingContext(ctx)
	c := adminwire.Caller{Header: md}
	if p, ok := peer.FromContext(ctx); ok {
		if p.Addr != nil {
			c.Peer = p.Addr.String()
		}
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			c.TLS = &info.State
		}
	}
	return c
}

// grpcError returns err, the admin service's answer, as the error grpc-go
// sends: a gRPC status error as it is, any other error that carries a
// status (an *idem.Error, another wire's) as that status.
func grpcError(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if st, ok := adminwire.Status(err); ok {
		return status.ErrorProto(st)
	}
	return err
}
