/*
Package admin serves idem's admin service, idem.admin.v1.AdminService
(proto/idem/admin/v1/admin.proto): it lets an operator list the
idempotency keys a store holds, count them, read everything kept of one,
forget one so that its next retry runs afresh, settle one stuck in
progress with an error its retries then replay, finish one that was
abandoned, and read the audit trail of those actions. It works on any
store that implements [store.Admin].

	srv := admin.NewServer(st, authorize,
		admin.WithPageTokenKey(pageTokenKey),
		admin.WithFinisher(finisher),
		admin.WithLogger(logger))

Serve it on a listener only operators reach, not on the public one: over
gRPC, next to grpc-go's health and reflection services, or over Connect
(and gRPC and gRPC-Web) with connect-go:

	interceptor.RegisterAdmin(grpcServer, srv)    // grpc-go
	mux.Handle(idemconnect.NewAdminHandler(srv)) // connect-go

# Wires

The package imports no transport. A [Server]'s methods are the service's
RPCs, with the request and response messages of gen/idem/admin/v1 (whose
package imports no grpc-go either), and answer with an [*idem.Error], a
google.rpc.Status; each wire's adapter maps a call to them and the answer
back, in one place: package interceptor for grpc-go, package idemconnect
for connect-go, as they do for idem's engine. So a Connect program serves
the service without building any of grpc-go, and a gRPC program without
any of connect-go, and every call goes through one implementation of each
RPC, its authorization included, whichever the wire. The service has no
generated grpc-go code for that reason (protoc-gen-go-grpc writes into the
messages' package): interceptor.RegisterAdmin describes it to grpc-go
from its protobuf descriptor, and idemconnect.NewAdminHandler serves it
with the generated adminv1connect handler, which [Server] implements.
Called directly, a [Server]'s method runs as over a wire with no header:
idem's command does so with -database-url.

# Authorization

An [Authorizer] is required: [NewServer] panics without one, as there is no
safe default. It is called first on every call, with the RPC, the tenant
and key asked for and the caller as the wire saw it (the request headers,
as gRPC metadata carries them, and the TLS connection's state: see
[Request]), and returns the operator's [Grant]: who the operator is (for
the log) and which tenants it may see and act on. A call on a tenant
outside the grant, or a ListKeys of every tenant by an operator granted
some, is answered PERMISSION_DENIED. An authorizer's error is answered with
its status when it carries one (UNAUTHENTICATED, say): an [*idem.Error]
(idem.NewError), answered alike on every wire, or the wire's own status
error (status.Error on gRPC, a *connect.Error on Connect); else
PERMISSION_DENIED, its text logged, not sent.

A grant with ReadOnly set lets its operator read only: ListKeys, GetKey,
GetKeyStats and ListAudit, the RPCs whose descriptor says they have no
side effects ([ReadOnlyMethod]); a forget, a settle or a finish is
PERMISSION_DENIED before the store is asked. An authorizer that gives
some operators a read-only grant needs no list of methods of its own.

# Audit trail

Every forget, settle and finish that changes a key is kept in the
store's audit trail ([store.AuditEntry]): the grant's Subject as the
operator, the time, the action, the reason the request gives, whether it
was forced, the key's state before and after, and the request that asked
(its [RequestIDHeader] header and the peer's address). A forget and a
settle keep their entry in the same transaction as the change, so there
is no change without its entry and no entry without its change; a
finish's outcome is recorded by the call's own transaction, and its entry
is added after it, in a transaction of its own (lost, with an ERROR log
line, if the store fails between). A forced action must give a reason,
and a reason is at most [store.MaxReasonLength] bytes of UTF-8 without a
NUL byte: INVALID_ARGUMENT otherwise, before the store is asked. A refused
action keeps no entry: its log line says who asked.

ListAudit lists the entries of one tenant, or every tenant's (for an
operator granted them all), by method, key (the key's history) and time
range, oldest first, with page tokens signed as ListKeys's are. Entries
are kept for the store's retention (90 days by default:
postgres.WithAuditRetention, memory.WithAuditRetention), and swept with
expired keys.

# Actions on many keys

ForgetKeys, SettleKeys and FinishKeys act on the keys a selection (a
ListKeys filter) matches, at most limit of them a call (required, 1 to
1000), oldest first, one by one with the rules of the action on one key:
a live lease is skipped unless forced, and a forced action fences its
holder; a recorded key is skipped by a settle; a key that cannot be
finished is skipped by a finish. Each key's result is returned: done, or
skipped with the answer the action on that key alone would have had. A
reason is required, and every key acted on keeps its audit entry with it.
A dry run changes nothing: it returns how many keys the selection
matches and the first limit of them. The answer's next_page_token, signed
for the RPC and its selection, resumes after the call's last key; a call
cut short (its caller gone) is resumed with the token it was given, as
every action skips what is done already. A read-only grant refuses them,
dry runs included.

# Counts

GetKeyStats counts the keys of a ListKeys filter by tenant, method and
state, and returns the oldest key in progress and the oldest abandoned.
What it costs is the store's: on PostgreSQL, counting the keys in progress
and abandoned (states in_progress and abandoned) reads an index of the
keys in progress only, cheap on any table; counting the recorded keys
reads every key the filter selects.

# Answers

An unknown key is NOT_FOUND; a forget or settle of a key whose lease is live
is FAILED_PRECONDITION naming when the lease runs out, unless forced (which
fences the lease's holder); a settle of a recorded key is
FAILED_PRECONDITION; a malformed key (see [store.Scope.Validate]), filter
(a tenant or method no key can hold: [store.KeyFilter.Validate]) or page
token is INVALID_ARGUMENT, before the store is asked. A store that fails is
answered UNAVAILABLE with a generic message: the store's own error, which
may hold SQL, goes to the log only.

A recorded response is decoded with the method's output type, found in the
protobuf registry (by the method's full name, or by its
(idem.v1.method).scope), and rendered as protobuf's JSON mapping; when the
server does not link the method's generated package, the response is
returned as the bytes recorded, with a note saying why. A recorded error is
returned as its google.rpc.Status.

# Settling a key

SettleKey records an error as the outcome of a key in progress, and every
retry of the key then gets that error, as it was settled and without
RetryInfo, until the key expires. So it takes an error's code that clients
do not retry, such as FAILED_PRECONDITION ("don't retry until the state is
fixed"): OK is refused (a response is the method's own to make), and so
are ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED, which
clients are told to retry (idem's own client recipes retry ABORTED and
UNAVAILABLE, go-grpc-middleware's retry interceptor RESOURCE_EXHAUSTED and
UNAVAILABLE by default, and a keyed call is safe to retry after its
deadline): a client retrying them would spend every attempt on an answer
that never changes. Both are INVALID_ARGUMENT naming the rule, before the
store is asked; the idem command's settle, over a server or a database,
goes through the same check.

# Finishing a call

FinishKey finishes one abandoned leased call now, instead of waiting for
the finisher's grace: the server's [idem.Finisher], given by
[WithFinisher], takes the call over as a retry would and runs it through
the handler registered with it, as its passes do ([idem.Finisher.FinishKey]),
and FinishKey answers with the key and the outcome recorded, decoded as
GetKey decodes it. Give it the Finisher the server runs, over the same
store. Without one, FinishKey answers UNIMPLEMENTED (once the call is
authorized).

Only a key that is abandoned (its lease ran out) and finishable (its
method opted in to finish, so its request was kept) can be finished;
otherwise the answer is FAILED_PRECONDITION saying why: the lease is live
until a time it names (its caller may still record an outcome; there is no
force), the method does not opt in to finish (settle or forget the key
instead), or the outcome is recorded already. When the attempt records
nothing (a retry took the call over first: ABORTED; the handler failed
transiently: its code), the call is left to the finisher, and FinishKey
may be called again.

# Page tokens

ListKeys's and ListAudit's page tokens wrap the store's cursor with an HMAC-SHA256 over the
cursor and the filter the page was listed with: a token that was altered,
or that comes back with another filter or to the other RPC, is refused
with INVALID_ARGUMENT.
The key is [WithPageTokenKey]'s; without it, each Server draws a random key,
so its tokens do not survive a restart and are not accepted by another
replica. Give every replica the same key to page across them.

# Console

[NewConsole] serves a console of a [Server] in the browser: web pages,
rendered on the server from templates built into the package, with no
script, that list the keys (by tenant, method, state and age, a page at a
time) with their counts, show one key (its state, lease, steps and
outcome, decoded as GetKey decodes it, and its history from the audit
trail, kept after the key is forgotten), and forget, settle and finish a
key. Each action is a link to a confirmation page, whose form names the
key, asks for a reason (required, even where the service takes none: a
form without one is refused with 400 and changes nothing; the audit trail
keeps it) and, for forget and settle, whether to force a live lease;
settle's form offers the codes SettleKey takes. The list's counts are a
GetKeyStats of its filter on its first page: of the keys in progress and
abandoned, which an index serves on any table, unless the filter names
states or the operator asks for every state (which reads every key the
filter selects). Mount it on the operators' listener, at a path of its
own (its links are relative):

	mux.Handle("/console/", http.StripPrefix("/console", admin.NewConsole(srv)))

Every page calls the Server's RPCs, as a wire does: the [Authorizer] is
asked about each, with the RPC's name (a list is ListKeys and
GetKeyStats, a key's page GetKey and ListAudit, a forget ForgetKey) and
the browser's request as the caller, its headers mapped as Connect's are
(so an operator's token is Header["authorization"]: a browser sends it as
HTTP basic authentication, or a proxy in front of the console, such as an
OAuth2 proxy, as a header of its own), its TLS state, for a client
certificate, and its remote address as the peer. A key's page and an
action's confirmation page also ask the Authorizer whether the action's
RPC would be allowed, and offer only the actions it allows: none to a
[Grant.ReadOnly] operator. A refusal is a page with the authorizer's
answer and its HTTP status (401 for UNAUTHENTICATED, 403 for
PERMISSION_DENIED); to make a browser ask for basic credentials, wrap the
console in a handler that adds a WWW-Authenticate challenge to a 401.
Every other answer is shown as the service sends it, with no store's
text, with the HTTP status of its code (404 for NOT_FOUND, 409 for
FAILED_PRECONDITION, 503 for UNAVAILABLE).

The actions are POSTs, refused with 403 when they come from another
origin ([http.CrossOriginProtection], which reads the browser's
Sec-Fetch-Site or Origin header): a page elsewhere cannot make an
operator's browser act. A request with neither header is no browser's, and
is let through, as a call on the service's wires would be. The pages cannot be framed (frame-ancestors
'none'), load nothing from elsewhere (a Content-Security-Policy of
default-src 'none'), are not cached and send no referrer; everything they
show is escaped (html/template).

# Observability

Each call runs in a span of the [WithTracerProvider] tracer provider
(default: the global one), named after the RPC, and is logged through
[WithLogger]'s logger (default: [slog.Default]) with who did what: the
grant's subject, the RPC, the tenant, method and key, and the answer's
code, by its google.rpc.Code name (FAILED_PRECONDITION), and the reason
an action gave. Calls that change a key are logged at INFO, reads at DEBUG, refusals
at WARN and store failures at ERROR with the store's error.
*/
package admin
