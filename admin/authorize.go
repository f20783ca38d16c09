package admin

import (
	"context"
	"crypto/tls"
	"slices"

	"google.golang.org/protobuf/types/descriptorpb"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/store"
)

// Request is what an operator asks of the service, and who asks, as an
// [Authorizer] sees it, whichever wire the call came on.
type Request struct {
	// Method is the RPC's full name, such as
	// "/idem.admin.v1.AdminService/ForgetKey" (the generated
	// adminv1connect.AdminServiceForgetKeyProcedure).
	Method string
	// Tenant is the tenant asked for: the key's, or the one ListKeys
	// lists. It is empty when AllTenants is set.
	Tenant string
	// AllTenants reports a ListKeys of every tenant's keys.
	AllTenants bool
	// Key is the key acted on; its Method and Key are empty for ListKeys.
	Key store.Scope
	// Force reports a forced ForgetKey or SettleKey, which fences a live
	// lease.
	Force bool
	// Reason is the reason a ForgetKey, SettleKey or FinishKey gives, which
	// the audit trail keeps.
	Reason string
	// Header is the call's request headers as gRPC metadata carries them,
	// whichever the wire: lower-case names, the values of -bin names
	// decoded; an operator's token, say, is Header["authorization"]. It is
	// the gRPC metadata, or the headers of the Connect, gRPC-Web or HTTP
	// request, as idem.WithTenant's function gets them. Do not change it.
	// It is nil when a Server's method is called directly, with no wire.
	Header map[string][]string
	// TLS is the state of the TLS connection the call came on, nil for a
	// call without TLS: the client certificate the handshake verified, when
	// the server asks for one, is TLS.VerifiedChains[0][0].
	TLS *tls.ConnectionState
	// Peer is the network address the call came from, as its wire gives
	// it (host:port); empty when a Server's method is called directly.
	// The audit trail keeps it.
	Peer string
}

// Grant is what an operator may do, as an [Authorizer] grants it.
type Grant struct {
	// Subject names the operator in the service's log lines and spans (a
	// user name or a certificate's subject, say).
	Subject string
	// AllTenants lets the operator see and act on every tenant's keys,
	// and list them all at once.
	AllTenants bool
	// Tenants are the tenants whose keys the operator may see and act on,
	// when AllTenants is not set.
	Tenants []string
	// ReadOnly lets the operator only read: list and get keys, count them
	// and read the audit trail (the RPCs [ReadOnlyMethod] reports). Every
	// other RPC (a forget, a settle, a finish) is refused with
	// PERMISSION_DENIED before the store is asked. The zero value lets the
	// operator act as well.
	ReadOnly bool
}

// ReadOnlyMethod reports whether the admin service's RPC fullMethod
// ("/idem.admin.v1.AdminService/ListKeys") only reads, so that a read-only
// [Grant] allows it: the RPCs whose descriptor says they have no side
// effects (idempotency_level = NO_SIDE_EFFECTS): ListKeys, GetKey,
// GetKeyStats and ListAudit. It is false for every other name, those of
// RPCs the service does not have included.
func ReadOnlyMethod(fullMethod string) bool {
	return readOnlyMethods[fullMethod]
}

// readOnlyMethods are the service's RPCs without side effects, by their
// full names, from its descriptor.
var readOnlyMethods = func() map[string]bool {
	sd := adminv1.File_idem_admin_v1_admin_proto.Services().ByName("AdminService")
	out := map[string]bool{}
	ms := sd.Methods()
	for i := range ms.Len() {
		md := ms.Get(i)
		opts, _ := md.Options().(*descriptorpb.MethodOptions)
		if opts.GetIdempotencyLevel() == descriptorpb.MethodOptions_NO_SIDE_EFFECTS {
			out["/"+string(sd.FullName())+"/"+string(md.Name())] = true
		}
	}
	return out
}()

// Allows reports whether s lets its operator see and act on tenant's keys.
func (s Grant) Allows(tenant string) bool {
	return s.AllTenants || slices.Contains(s.Tenants, tenant)
}

// An Authorizer decides who may call the service. Authorize is called
// first on every call, with the caller's identity in r: a token in
// r.Header, a client certificate in r.TLS, which serve gRPC and Connect
// alike (on gRPC, ctx also carries grpc's peer and metadata). It returns
// the caller's [Grant], or an error to refuse the call outright. An
// [*idem.Error] (from idem.NewError, answered alike on every wire) or an
// error of the call's wire that carries a status (status.Error on gRPC, a
// *connect.Error on Connect) is answered with its code and message; any
// other with PERMISSION_DENIED, its text logged, not sent.
type Authorizer interface {
	Authorize(ctx context.Context, r Request) (Grant, error)
}

// AuthorizerFunc is a function that is an [Authorizer].
type AuthorizerFunc func(ctx context.Context, r Request) (Grant, error)

// Authorize calls f(ctx, r).
func (f AuthorizerFunc) Authorize(ctx context.Context, r Request) (Grant, error) {
	return f(ctx, r)
}
