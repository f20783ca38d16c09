// Command idem lets an operator list the idempotency keys an idem store
// holds, count them, read one, forget one so that its next retry runs
// afresh, settle one stuck in progress with an error its retries then
// replay, finish one that was abandoned, and read the audit trail of
// those actions.
//
// Usage:
//
//	idem keys list    [connection] [-tenant T | -all-tenants] [-method M] [-state S]...
//	                  [-created-after T] [-created-before T] [-limit N] [-page-token P] [-all]
//	                  [-watch D]
//	idem keys stats   [connection] [-tenant T | -all-tenants] [-method M] [-state S]...
//	                  [-created-after T] [-created-before T]
//	idem keys get     [connection] -tenant T -method M -key K   (or the key as an argument)
//	idem keys history [connection] -tenant T -method M -key K
//	idem keys forget  [connection] -tenant T -method M -key K [-force -reason R]
//	idem keys settle  [connection] -tenant T -method M -key K -code C [-message M] [-force -reason R]
//	idem keys finish  [connection] -tenant T -method M -key K [-reason R]
//	idem audit list   [connection] [-tenant T | -all-tenants] [-method M [-key K]]
//	                  [-since T] [-until T] [-limit N] [-page-token P] [-all]
//	idem bulk forget|settle|finish [connection] [list's filters] -limit N -reason R
//	                  [-force] [-code C -message M] [-dry-run | -yes] [-all] [-page-token P]
//
// # Connection
//
// Exactly one of:
//
//	-addr host:port        the admin service (idem.admin.v1.AdminService) of a
//	                       server; default $IDEM_ADMIN_ADDR
//	-database-url URL      the database itself (postgres://… or key=value …)
//
// With -addr the call goes over TLS, verified against the system's roots
// or -ca file (PEM), with -server-name to verify another name than the
// address's host; -cert and -cert-key (PEM) present a client certificate,
// which is how the admin package's example authorizer names an operator. -H
// 'name: value' adds a metadata entry (a request header) to every call,
// such as an operator's token (-H 'authorization: Bearer …'); repeat it for
// more. -insecure dials in plaintext, and only a loopback address (an SSH
// tunnel or kubectl port-forward, say). The server's authorizer decides
// what the operator may see and do.
//
// -protocol says what the server at -addr speaks: grpc (the default), for
// a grpc-go server (interceptor.RegisterAdmin) or any gRPC server; connect,
// for a Connect handler (idemconnect.NewAdminHandler) over HTTP/1.1 or, with
// TLS, HTTP/2, such as one in a program without grpc-go. The calls and the
// answers are the same.
//
// With -database-url the command runs the admin service in its own process
// over the PostgreSQL store (postgres.New), with no authorizer: whoever
// holds the database's credentials may already read and change every key,
// so those credentials are the authority, over every tenant. Use it when
// no server runs the admin service. Its page tokens are accepted by later
// runs with -database-url only.
//
// -timeout bounds each call (default 30s); -o json prints the service's
// answer as protobuf's JSON mapping, one document, instead of a table.
//
// # Commands
//
// list prints the keys that match its filters, oldest first: one tenant's
// (-tenant, the empty tenant's if not given) or, with -all-tenants, every
// tenant's; -method selects one method's full name or scope; -state
// selects in_progress, abandoned, recorded or expired keys (repeat it or
// give a comma list); -created-after and -created-before take RFC 3339
// times. -limit sets the page size (the service's default is 100, its
// most 1000); without -all one page is printed and the next page's token
// goes to stderr, for -page-token; -all follows the tokens to the end, and
// -o json then prints one ListKeysResponse that holds every key. -watch 5s
// lists again every 5 seconds, each listing headed by the time, until
// interrupted (Ctrl-C), and then exits 0.
//
// stats prints how many keys its filters (list's, without the paging)
// select, per tenant, method and state, and the oldest key in progress
// and the oldest abandoned. -state in_progress,abandoned counts the stuck
// keys only, which the PostgreSQL store reads from an index of the keys in
// progress: cheap on any table; counting the recorded keys reads every
// key the filters select.
//
// history prints the audit trail of one key, oldest first: each forget,
// settle and finish, when, by whom (the authorizer's name for the
// operator; "database user" with -database-url), whether forced, the
// key's state before and after, and the reason given. The trail outlives
// the key's entry. audit list prints the trail of a tenant (or, with
// -all-tenants, every tenant), of a method or a key, between -since and
// -until (RFC 3339), a page at a time as list does.
//
// get prints everything kept of one key: its state, times, steps and, once
// recorded, its outcome (a recorded response as JSON when the server links
// the method's generated code, else its size and why).
//
// forget deletes a key's entry, so that its next retry runs afresh. A key
// whose lease is live is refused unless -force, which fences the lease's
// holder: it then records nothing. -reason says why, for the audit trail;
// -force needs one.
//
// settle records an error as a key's outcome, so that its retries stop
// waiting and replay it. -code is a gRPC code, by name
// (FAILED_PRECONDITION, failed_precondition, FailedPrecondition) or
// number, and never OK: a response is the method's own to make. Nor is it
// a code clients retry (ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED,
// DEADLINE_EXCEEDED): every retry of the key gets the settled error,
// without a retry delay, until the key expires, so a client that retries
// its code would spend all its attempts on it. The admin service refuses
// such a code with INVALID_ARGUMENT, with -addr and -database-url alike;
// FAILED_PRECONDITION ("don't retry until the state is fixed") is the
// usual choice. -message is the error's message. A key whose lease is
// live is refused unless -force (with -reason), which fences its holder; a
// recorded key is refused (forget it instead).
//
// finish runs an abandoned call to its end now, through the server's
// finisher, rather than after the finisher's grace: the key must be
// abandoned (its lease ran out) and kept for a finisher (its method opts in
// to finish). It prints the key with its recorded outcome. A server without
// a finisher answers UNIMPLEMENTED; with -database-url there is none, as no
// handler runs in the command.
//
// bulk forget, bulk settle and bulk finish act on the keys list's filters
// select, -limit keys a call (required), each key with the rules of the
// action on one (a live lease is skipped unless -force; bulk settle takes
// -code and -message), and print each key's result: done, or skipped and
// why. -reason is required, and kept in every key's audit entry. Without
// -yes, on a terminal, the command makes a dry run: it prints how many
// keys match and the first -limit of them, and changes nothing; without
// -yes elsewhere (a script) it refuses to run. -all makes call after call
// until no key is left; after each call stderr says how many keys are done
// and skipped so far, and the -page-token that resumes after it, should
// the command be interrupted.
//
// # Exit status
//
// 0 on success; 1 when a call fails, with its code (gRPC's, which Connect
// shares) and message on stderr (NOT_FOUND for an unknown key,
// FAILED_PRECONDITION for a live lease or a recorded key, INVALID_ARGUMENT
// for a settle code clients retry, PERMISSION_DENIED from the authorizer);
// 2 for a usage error.
//
// # grpcurl and curl
//
// The admin service is plain gRPC: when a server registers grpc-go's
// reflection service next to it (as the admin package's example does),
// grpcurl calls it too:
//
//	grpcurl -cert op.crt -key op.key -d '{"tenant": "acme", "states": ["KEY_STATE_ABANDONED"]}' \
//	    admin.internal:9091 idem.admin.v1.AdminService/ListKeys
//
// A Connect handler of it takes a POST of JSON:
//
//	curl --cert op.crt --key op.key -H 'Content-Type: application/json' \
//	    -d '{"tenant": "acme", "states": ["KEY_STATE_ABANDONED"]}' \
//	    https://admin.internal:9091/idem.admin.v1.AdminService/ListKeys
package main
