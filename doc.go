// Package idem makes mutating calls safe to retry: it is the
// transport-neutral core that idem's adapters (gRPC in package interceptor,
// Connect in idemconnect, HTTP/JSON through grpc-gateway in idemgateway)
// put in front of a service. It is what a server or client author writes
// against: the engine and its options, the per-method policy, steps and
// child keys, the finisher, the results and the error. What only an
// adapter needs is in package [github.com/idemkit/idem/transport].
//
// A client attaches an idempotency key (gRPC metadata [KeyHeader], the
// HTTP header [HTTPKeyHeader]) to a call. The [Engine] claims the key in a
// [store.Store], runs the handler once, records its outcome and replays
// that outcome, byte for byte, to every retry with the same key. A retry can
// therefore never apply a side effect twice, whether it comes from the
// client, a load balancer, a mesh or the transport's own retry policy.
//
// # Terms
//
// Each word below means one thing, in the code, the docs, the proto, the
// idem command and the metrics:
//
//   - key: the string a client sends to name one operation, the same on
//     every retry of it ([KeyHeader]).
//   - scope: where a key is kept, (tenant, method or its scope name, key);
//     the same key in two scopes names two operations.
//   - claim: taking a key for one execution of the handler.
//   - record: storing a call's outcome under its key, once.
//   - replay: answering a retry from the recorded outcome.
//   - lease: the time-bound hold of a claim in leased mode, with its
//     fencing token.
//   - step: a named unit of work of a leased handler ([Step]), whose result
//     is saved and never run twice.
//   - child key: the key of a call a keyed handler makes, derived from its
//     request's scope ([ChildKey]).
//   - finish: running an abandoned leased call to its end on the server
//     ([Finisher]).
//   - settle: the operator's action that records an error under a key
//     still in progress, for its retries to replay (the admin service's
//     SettleKey).
//   - forget: the operator's action that deletes a key, so that its next
//     call runs afresh.
//   - outcome: what a call's handler produced, a response or an error, as
//     recorded and replayed.
//   - result: how idem ended a call ([Result]; the metric attribute
//     idem.result), for instance executed, replayed or in_use.
//   - fingerprint: the hash of the request that tells a retry from another
//     request under the same key.
//
// # Usage
//
// Build one engine with [New] on a store and hand it to the adapters:
//
//	engine, err := idem.New(postgres.New(pool), idem.WithTenant(tenantOf))
//	if err != nil {
//		return err // an option names a method that is not a unary method in the protobuf registry
//	}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
//		recovery.UnaryServerInterceptor(),
//		interceptor.UnaryServerInterceptor(engine),
//	))
//
// With the PostgreSQL store the handler does its writes on the transaction
// that holds the key, from postgres.TxFromContext, so the key, the writes and
// the recorded response commit together or not at all.
//
// Defaults: a lease of 60 s ([MethodPolicy]), a retry delay of 1 s
// ([WithRetryDelay]), responses recorded up to 1 MiB
// ([WithMaxStoredResponseBytes]); a [Finisher] passes every 10 s, takes
// over calls whose lease ran out 30 s ago, 100 at a time, gives up after 8
// attempts, and bounds its list by its interval and each attempt by 1 min
// ([FinisherOption]).
//
// # Which methods are keyed
//
// Policy lives in the .proto file and is read from the method descriptor,
// or, for a method whose .proto file the server does not own, is set in Go
// with [WithMethodPolicy], which replaces the option wholesale:
//
//   - option (idem.v1.method).key_required = true: a call without a key
//     fails with INVALID_ARGUMENT.
//   - option idempotency_level = IDEMPOTENT or NO_SIDE_EFFECTS: the method
//     is safe to retry as it is; it bypasses idem. A well-formed key is
//     ignored and the call runs untouched, but a malformed one (see below)
//     is refused with INVALID_ARGUMENT, as on any method: it is a bug of
//     the client, which should hear of it. This holds on every transport.
//   - otherwise: keyed when the client sends a key, untouched when it does
//     not.
//
// A key is exactly one metadata value of 1 to 255 visible ASCII characters;
// a call with more than one value, or with a key (in its metadata or its key
// field, below) that breaks this rule, has a malformed key.
// A request may carry it instead, in a string field marked
// (idem.v1.field).key = true (as Google's APIs carry a request_id); the
// field is then left out of the fingerprint, and a key in both the metadata
// and the field must be the same; a key in the metadata alone is set in the
// field before the handler runs, so the handler finds it there. It is scoped by tenant (see [WithTenant])
// and method, so the same key in two tenants or on two methods names two
// independent operations. The method's name in the scope is its full name,
// or the name its option (idem.v1.method).scope gives: set it before
// renaming a package, service or method, to the old full name, so that keys
// in flight across the deploy keep their answers. Keys are kept for the
// store's TTL, or for the method's own, (idem.v1.method).ttl; the first
// answer and every replay tell the client when its key expires, in the
// header [ExpiresHeader] (RFC 3339). Streaming methods take no key: the
// adapters refuse one with INVALID_ARGUMENT.
// A scope that no store can hold (a tenant over 255 bytes, or one that is
// not valid UTF-8 or holds a NUL byte; the rule of store.Scope.Validate) is
// refused before anything is claimed, with INVALID_ARGUMENT and ErrorInfo
// reason IDEMPOTENCY_SCOPE_INVALID; the message names the field and the
// rule, and the value's length, never the value.
// Fields marked (idem.v1.field).fingerprint_exclude, such as trace ids, are
// left out of the request fingerprint; metadata never enters it.
//
// # Status codes
//
// As gRPC status codes (Connect uses the same; HTTP/JSON through
// grpc-gateway gets the statuses of package idemgateway):
//
//	situation                                  answer
//	new key                                    run the handler, record, reply
//	same key, same request, recorded           replay the recorded response or error,
//	                                           with header idempotent-replayed: true
//	same key, other request                    FAILED_PRECONDITION, ErrorInfo reason IDEMPOTENCY_KEY_REUSED
//	same key, still running after the wait     ABORTED, RetryInfo and ErrorInfo reason IDEMPOTENCY_KEY_IN_USE
//	key missing where required                 INVALID_ARGUMENT, BadRequest violation on idempotency-key,
//	                                           ErrorInfo reason IDEMPOTENCY_KEY_MISSING
//	key malformed                              INVALID_ARGUMENT, BadRequest violation on idempotency-key
//	                                           that says what is wrong, ErrorInfo reason IDEMPOTENCY_KEY_INVALID
//	tenant or method the store cannot hold     INVALID_ARGUMENT, ErrorInfo reason IDEMPOTENCY_SCOPE_INVALID
//	leased call whose saved steps are unreadable
//	                                           DATA_LOSS, ErrorInfo reason IDEMPOTENCY_STEPS_UNREADABLE
//	abandoned call a Finisher gave up on       FAILED_PRECONDITION, ErrorInfo reason IDEMPOTENCY_NOT_FINISHED,
//	                                           recorded and replayed
//	the store failed                           UNAVAILABLE, RetryInfo; nothing was recorded
//
// Handler errors that the classifier calls deterministic ([WithClassifier];
// by default INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE,
// ALREADY_EXISTS and NOT_FOUND) are recorded as a google.rpc.Status and
// replayed; the handler's writes are discarded and the key stays taken. Every other error, a panic,
// or a failure to commit releases the key and discards the writes, so the
// retry runs afresh: a network blip never poisons a key.
//
// # Atomic, optimistic, auto and leased mode
//
// In atomic mode (the default) the claim, the handler's writes and the
// recorded outcome share one transaction of the store, handed to the handler
// through the context (postgres.TxFromContext). Use it when the handler's
// side effects live in the same database.
//
// [ModeOptimistic] runs the handler in that transaction too, but reads the
// key only when recording: where another request recorded it first, the
// handler's writes are rolled back and the call answers from that
// request's outcome. A first execution costs less; a retry costs a handler
// run that is rolled back. [ModeAuto] chooses per call: a call its client
// marks as the first attempt of its key ([AttemptHeader] 1, which idem's
// client adapters send with the keys they make) is claimed as in
// optimistic mode, and a retry (AttemptHeader above 1, grpc-go's
// grpc-previous-rpc-attempts, go-grpc-middleware's x-retry-attempt, each
// of which wins over a first attempt's mark) or an unmarked call as in
// atomic mode. The mark chooses how the claim starts, never the outcome:
// the key's row decides that, so a wrong mark costs time, never a second
// side effect.
//
// In leased mode, for handlers whose side effects leave the database (a
// payment provider, an email), the claim commits at once with a lease and a
// fencing token; the handler runs with no transaction of idem's, the lease
// is extended every third of its length while it runs, and the outcome is
// recorded only if the token is still the key's. A method is leased by its
// option (idem.v1.method).mode = MODE_LEASED (with an optional lease), or by
// [WithMethodPolicy]. A duplicate that arrives while the lease runs gets ABORTED
// with the lease's remaining time (at most 30 s) as its RetryInfo delay. Once
// a lease has run out, a retry with the same request takes the key over and
// resumes after the last [Step] the handler saved; the earlier worker can
// then record nothing and runs no further [Step] (each checks the lease before it
// runs), its context is cancelled with store.ErrLeaseLost when the heartbeat
// or a step notices, and its caller gets ABORTED with ErrorInfo reason
// IDEMPOTENCY_LEASE_LOST. A transient error releases the key as in atomic
// mode, except after a step was saved: then the lease ends at
// once and the claim stays, so the retry takes over and resumes. Do not
// change a method's mode while its keys live.
//
// A leased claim's bookkeeping lives as long as the handler, not as long as
// its caller: extending the lease, recording the outcome and releasing the
// claim run on a context detached from the request's, so a handler that
// finishes its side effect after its client's deadline keeps its key and
// has its outcome recorded. Each of these store calls has a bound of its
// own: an extension a third of the lease (at most 5 s), recording and
// releasing 5 s. Only a transient error or a panic releases the claim; when
// recording the outcome of a handler that succeeded, or failed
// deterministically, fails, the claim stays in progress, the caller gets
// UNAVAILABLE with the lease as its RetryInfo delay, and once the lease has
// run out a retry takes the call over and resumes after its last saved
// step.
//
// # Steps and finishing
//
// A leased handler runs each side effect as a [Step]: once per call,
// however often the call is taken over, with the step's result saved and
// returned to later attempts, and the step's child key on its outbound
// calls. Methods that opt in ((idem.v1.method).finish, or [MethodPolicy].Finish)
// keep their request with the leased claim, and a [Finisher]
// ([NewFinisher]) finishes those whose callers are gone: it takes an abandoned
// call over as a retry would and runs it, from its last step, to the end,
// so the caller's retry, whenever it comes, replays the outcome.
//
// # Large responses
//
// A response larger than [WithMaxStoredResponseBytes] (1 MiB by default)
// reaches its first caller but is recorded as "not cached", with the small
// reference its method's [Loader] returns, if it has one. A retry then gets
// the response the Loader rebuilds, or, for a method declared safe to run
// twice (rerun_when_not_cached in its option, or [MethodPolicy].RerunWhenNotCached),
// a second run of the handler; otherwise FAILED_PRECONDITION with ErrorInfo
// reason IDEMPOTENCY_RESPONSE_NOT_CACHED. Recorded errors are not capped.
//
// # Replay
//
// The handler's response metadata (the headers and trailers it sets,
// without transport and idem headers) is recorded with its outcome and sent
// again with every replay.
//
// The response is recorded as its deterministic protobuf encoding, and every
// reply for the key carries exactly those bytes. For a response type without
// map fields or extensions, re-encoding a decoded message reproduces them, so
// the handler's own message (first call) and a decoded copy (replays) pass
// through the interceptors outside idem as usual. For types with maps or
// extensions, whose entry order protobuf leaves open, the gRPC and Connect
// adapters send an empty message of the response type that carries the
// recorded bytes as unknown fields; interceptors outside idem then see no
// fields set.
// The recorded bytes carry the call's status code and a CRC-32C checksum of
// code and payload. A recorded outcome that idem cannot vouch for is never
// sent: one that no longer decodes, whose code is not a gRPC code (0 to 16)
// or differs from its row's, or whose checksum fails (a row changed by
// hand, say an error relabelled as a success) fails the call with INTERNAL,
// and the problem is logged. Rows recorded by versions of idem before the
// checksum are still replayed; a response among them must decode without
// fields unknown to its type, unless its type is replayed as raw bytes.
//
// # Transports
//
// The [Engine] is transport-neutral: an adapter hands it each call and the
// handler, through package [github.com/idemkit/idem/transport], and sends
// the answer and the error, an [*Error] (a google.rpc.Status) for idem's
// own answers, in its transport's way. The gRPC adapter
// ([github.com/idemkit/idem/interceptor]), the Connect adapter
// (github.com/idemkit/idem/interceptor/idemconnect) and, through the gRPC
// adapter, the grpc-gateway adapter (module
// github.com/idemkit/idem/interceptor/idemgateway) use one engine, so that
// a call and its retry over another transport are one operation.
// Over HTTP the key is the IETF draft's header [HTTPKeyHeader]. [WithReportHook]
// sees how each call went, whatever its transport.
//
// # Errors and logging
//
// Clients never see the text of internal errors: a failure of the store
// (while claiming, leasing or recording) answers UNAVAILABLE with a
// RetryInfo and a message that says only what idem was doing; a [Loader]
// that fails, UNAVAILABLE likewise; a response or error that cannot be
// encoded, INTERNAL. The full error goes to the server's log
// ([WithLogger], by default [log/slog.Default]), with the method, the tenant
// and the key. [WithVerboseErrors] adds the error's text to the client's
// message, for development. A healthy server logs nothing per request.
//
// # Metrics, traces and logs
//
// Every call the engine handles ends in one [Result], which idem
// reports four ways, never with the key, the tenant or the fingerprint:
//
//   - metrics, through the OpenTelemetry metric API ([WithMeterProvider],
//     by default the global provider): the counter idem.server.requests
//     with attributes rpc.method ("pkg.Service/Method"), idem.mode and
//     idem.result; the histograms idem.claim.duration and
//     idem.record.duration, in seconds, waits on a busy key included; the
//     counters idem.lease.takeovers and idem.lease.extensions. Outgoing
//     keys (the client adapters', see "Calling other services") are counted in
//     idem.client.keys, with attributes rpc.method and idem.key.source
//     (generated, derived, caller).
//   - traces: the call's span in the context (started by a stats handler
//     such as otelgrpc's) gets the attributes idem.result, idem.replayed
//     and idem.mode (in auto mode also idem.optimistic, whether the claim
//     read nothing first), and the events idem.key_in_use (with idem.claim.wait,
//     the seconds the claim waited) and idem.lease.takeover; when that
//     span is recorded, the store calls run in its child spans idem.claim
//     and idem.record ([WithTracerProvider], by default the global
//     provider).
//   - logs: the gRPC adapter adds the fields idem.result and idem.replayed
//     to the fields of go-grpc-middleware v2's logging interceptor, which
//     prints them on its "finished call" line, when it comes before idem in
//     the chain (see package interceptor).
//   - the report hook ([WithReportHook]), with a [Report] of the method,
//     the mode, the result, whether the answer was replayed, whether the
//     claim read nothing first, and the durations.
//
// # Calling other services
//
// The client adapters (interceptor.UnaryClientInterceptor,
// idemconnect.NewClientInterceptor), configured with [ClientOption]s,
// attach an idempotency key to each outgoing call of a keyed method, once
// per logical call, so that every retry made below them carries the same
// key. A method is keyed when its descriptor says
// (idem.v1.method).key_required or [WithKeyedMethods] selects it;
// IDEMPOTENT and NO_SIDE_EFFECTS methods never are. The key is, in order
// of precedence:
//
//  0. the key the request carries in its field marked (idem.v1.field).key
//     (a request_id, as AIP-155 has it), when that field is set: it is the
//     call's key, on every retry, and idem attaches none of its own (the
//     caller's metadata goes as it is, less the key of the request being
//     handled). An empty field changes nothing, nor does one that holds the
//     key of the request being handled (a handler that sends on the
//     message it was sent), which is never forwarded;
//  1. the key set with [ContextWithKey], sent as it is (to optional-key
//     methods too);
//  2. a key the caller put in the outgoing metadata ([KeyHeader]), sent as
//     it is, unless it is the key of the request being handled, which is
//     never forwarded and is replaced as in 3;
//  3. inside a keyed handler (see [KeyFromContext]), a child key of the
//     request's whole scope, its tenant, method and key: for a call made in
//     a [Step], the step's, [ChildKey](ctx, step); else one keyed by the
//     method called and the call's ordinal among this request's calls to
//     that method (the second call to CreatePayment, say), from a tuple
//     that no step name hashes like. A retried request therefore sends the
//     same child keys in the same order, and the services it calls replay
//     instead of repeating. Calls whose order may vary between runs of the
//     handler (concurrent ones, say) send a child key of their own, as 1:
//     [ContextWithKey](ctx, key) with key from ChildKey(ctx, step);
//  4. otherwise a new UUID (version 7, time-ordered, so that consecutive
//     keys land near each other in the server's index).
//
// A call with a key of 4, or of 3 inside a request that was itself marked
// as a first attempt, is marked as the first attempt of its key
// ([AttemptHeader] 1), unless the caller set that metadata: the retries
// below the adapter add their own marks, which win. A key of 0, 1 or 2 is
// the caller's, whose call may be a retry, and gets no mark.
//
// Two calls never share a key, nor do two operations that share a key
// string in different tenants or methods. The request's own key is never
// forwarded, on any method: a handler that copies its incoming metadata to
// its outgoing context, or its request's key field to the request it
// sends, sends a keyed method its child key, and an IDEMPOTENT,
// NO_SIDE_EFFECTS or unselected optional-key method no key at all (in a
// copy of the request whose key field is cleared). [ChildKey] gives a
// handler the child key of a step for calls over other transports (HTTP, a
// provider's SDK).
//
// When the key is idem's (1, 3 or 4) and the method's request has an empty
// field marked (idem.v1.field).key (or one that holds the key of the
// request being handled), the key also goes in that field, as Google's
// client libraries fill a request_id (AIP-4235). The call carries it
// twice, in the field and in the metadata: idem's server accepts the two
// because they are the same, and a server or proxy that reads only one of
// them still reads the call's key. The field is set on a copy of the
// request (proto.Clone), which the adapter sends: the caller's message is
// never changed. A message shared between goroutines is never written to,
// and one sent again, or used as a template for other calls, makes another
// logical call, with a key of its own (a filled field would silently make
// it a replay of the first). The retries below the adapter (grpc-go's
// retryPolicy, which resends the first attempt's bytes; a retry
// interceptor placed after idem's, which sends the same copy again) keep
// the filled key. A caller that retries by calling again, above the
// adapter, sets the field (or [ContextWithKey]) itself, and keeps it. The
// key idem generates for the field is the UUIDv7 of 4, one key for both
// places: idem's server takes any key, and a version 7 UUID is a UUID to
// an API that asks for one. An API that declares its field
// (google.api.field_info).format = UUID4 and checks the version should
// have its callers fill the field.
package idem
