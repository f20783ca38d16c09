package idemconnect

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/admin"
	"github.com/idemkit/idem/gen/idem/admin/v1/adminv1connect"
	"github.com/idemkit/idem/internal/adminwire"
)

func init() {
	// The admin service's core reads an Authorizer's or a finished
	// handler's *connect.Error through this.
	adminwire.RegisterStatus(func(err error) (*spb.Status, bool) {
		var ce *connect.Error
		if !errors.As(err, &ce) {
			return nil, false
		}
		return statusOf(err), true
	})
}

// NewAdminHandler returns the path and the handler that serve srv, idem's
// admin service (idem.admin.v1.AdminService, package admin), over Connect,
// gRPC and gRPC-Web, as the generated adminv1connect.NewAdminServiceHandler
// does, with opts (interceptors, say, placed before its own):
//
//	mux.Handle(idemconnect.NewAdminHandler(admin.NewServer(st, authorize, opts...)))
//
// The authorizer's [admin.Request] carries the request headers as its
// Header, as gRPC metadata carries them (lower-case names, the values of
// -bin names decoded, after the interceptors of opts), and, over TLS, the
// connection's state as its TLS. The service's answers ([*idem.Error]) are
// sent as *connect.Error with their code, message and details; an
// authorizer's own *connect.Error as it is. A program that serves the
// admin service so builds no package of grpc-go.
func NewAdminHandler(srv *admin.Server, opts ...connect.HandlerOption) (string, http.Handler) {
	opts = append(opts[:len(opts):len(opts)], connect.WithInterceptors(connect.UnaryInterceptorFunc(adminCall)))
	path, h := adminv1connect.NewAdminServiceHandler(srv, opts...)
	return path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tlsKey{}, r.TLS)))
	})
}

// tlsKey is the context key of the TLS state of an admin call's
// connection, which connect-go does not give an interceptor.
type tlsKey struct{}

// adminCall runs an admin call with its caller in the context, and sends
// its answer as a *connect.Error.
func adminCall(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		state, _ := ctx.Value(tlsKey{}).(*tls.ConnectionState)
		ctx = adminwire.NewContext(ctx, adminwire.Caller{Header: toMetadata(req.Header()), TLS: state, Peer: req.Peer().Addr})
		resp, err := next(ctx, req)
		if err != nil {
			return nil, adminError(err)
		}
		return resp, nil
	}
}

// adminError returns err, the admin service's answer, as the error
// connect-go sends: a *connect.Error as it is, any other error that
// carries a status (an *idem.Error, another wire's) as that status.
func adminError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	if st, ok := adminwire.Status(err); ok {
		return connectError(st)
	}
	return err
}
