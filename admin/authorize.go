package admin

import (
	"context"
	"crypto/tls"
	"slices"

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
}

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
