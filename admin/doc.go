/*
Package admin serves idem's admin service, idem.admin.v1.AdminService
(proto/idem/admin/v1/admin.proto): it lets an operator list the
idempotency keys a store holds, read everything kept of one, forget one so
that its next retry runs afresh, and settle one stuck in progress with an
error its retries then replay. It works on any store that implements
[store.Admin].

	srv := admin.NewServer(st, authorize,
		admin.WithPageTokenKey(pageTokenKey),
		admin.WithLogger(logger))
	admin.Register(grpcServer, srv)

Serve it on a listener only operators reach, next to grpc-go's health and
reflection services, not on the public one.

# Authorization

An [Authorizer] is required: [NewServer] panics without one, as there is no
safe default. It is called first on every call, with the RPC and the tenant
and key asked for, and returns the operator's [Scope]: who the operator is
(for the log) and which tenants it may see and act on. A call on a tenant
outside the scope, or a ListKeys of every tenant by an operator scoped to
some, is answered PERMISSION_DENIED. An authorizer's error is answered with
its gRPC status when it carries one (UNAUTHENTICATED, say), else
PERMISSION_DENIED.

# Answers

An unknown key is NOT_FOUND; a forget or settle of a key whose lease is live
is FAILED_PRECONDITION naming when the lease runs out, unless forced (which
fences the lease's holder); a settle of a recorded key is
FAILED_PRECONDITION; a malformed key, filter or page token is
INVALID_ARGUMENT. A store that fails is answered UNAVAILABLE with a generic
message: the store's own error, which may hold SQL, goes to the log only.

A recorded response is decoded with the method's output type, found in the
protobuf registry (by the method's full name, or by its
(idem.v1.method).scope), and rendered as protobuf's JSON mapping; when the
server does not link the method's generated package, the response is
returned as the bytes recorded, with a note saying why. A recorded error is
returned as its google.rpc.Status.

# Page tokens

ListKeys's page tokens wrap the store's cursor with an HMAC-SHA256 over the
cursor and the filter the page was listed with: a token that was altered,
or that comes back with another filter, is refused with INVALID_ARGUMENT.
The key is [WithPageTokenKey]'s; without it, each Server draws a random key,
so its tokens do not survive a restart and are not accepted by another
replica. Give every replica the same key to page across them.

# Observability

Each call runs in a span of the [WithTracerProvider] tracer provider
(default: the global one), named after the RPC, and is logged through
[WithLogger]'s logger (default: [slog.Default]) with who did what: the
scope's subject, the RPC, the tenant, method and key, and the answer's
code. Calls that change a key are logged at INFO, reads at DEBUG, refusals
at WARN and store failures at ERROR with the store's error.
*/
package admin
