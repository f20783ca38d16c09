package admin

import (
	"context"
	"slices"

	"github.com/idemkit/idem/store"
)

// Request is what an operator asks of the service, as an [Authorizer] sees
// it.
type Request struct {
	// Method is the RPC's full name, such as
	// "/idem.admin.v1.AdminService/ForgetKey" (the generated
	// adminv1.AdminService_ForgetKey_FullMethodName).
	Method string
	// Tenant is the tenant asked for: the key's, or the one ListKeys
	// lists. It is empty when AllTenants is set.
	Tenant string
	// AllTenants reports a ListKeys of every tenant's keys.
	AllTenants bool
	// Key is the key acted on; its Method and Key are empty for ListKeys.
	Key store.Key
	// Force reports a forced ForgetKey or SettleKey, which fences a live
	// lease.
	Force bool
}

// Scope is what an operator may do, as an [Authorizer] grants it.
type Scope struct {
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
func (s Scope) Allows(tenant string) bool {
	return s.AllTenants || slices.Contains(s.Tenants, tenant)
}

// An Authorizer decides who may call the service. Authorize is called
// first on every call, typically with the caller's identity read from ctx
// (a client certificate through grpc's peer package, or a token from the
// metadata); it returns the caller's [Scope], or an error to refuse the
// call outright. An error that carries a gRPC status (status.Error) is
// answered with it; any other with PERMISSION_DENIED, its text logged, not
// sent.
type Authorizer interface {
	Authorize(ctx context.Context, r Request) (Scope, error)
}

// AuthorizerFunc is a function that is an [Authorizer].
type AuthorizerFunc func(ctx context.Context, r Request) (Scope, error)

// Authorize calls f(ctx, r).
func (f AuthorizerFunc) Authorize(ctx context.Context, r Request) (Scope, error) {
	return f(ctx, r)
}
