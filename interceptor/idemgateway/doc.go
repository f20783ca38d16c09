// Package idemgateway serves idem's contract over HTTP/JSON through
// grpc-gateway, as draft-ietf-httpapi-idempotency-key-header describes it:
// the client sends its key in the Idempotency-Key header, a replay carries
// Idempotent-Replayed: true, the first answer and every replay carry
// Idempotency-Key-Expires (the key's expiry, RFC 3339), and idem's refusals
// are answered with the draft's status codes and RFC 9457 problem details.
// The headers have the names Connect clients of idem see (package
// idemconnect), without grpc-gateway's Grpc-Metadata- prefix.
//
// grpc-gateway calls the gRPC server, so idem's server interceptor
// ([github.com/idemkit/idem/interceptor.UnaryServerInterceptor]) does the
// work, with the same engine, store, fingerprint and scope as for gRPC
// clients: a call over gRPC and its retry over HTTP are one operation, and
// the retry gets the recorded response, rendered as JSON. This package
// only translates: the key from HTTP to gRPC metadata (read with
// [github.com/idemkit/idem/transport.ParseHTTPKey], as idem's Connect
// adapter reads it), idem's response headers back, and idem's errors to
// HTTP.
//
// # Usage
//
// Give the ServeMux the options of [ServeMuxOptions], and register the
// services with the generated Register…Handler, Register…HandlerFromEndpoint
// or Register…HandlerClient functions, which call the gRPC server through a
// connection, so that its interceptors run:
//
//	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
//	err := paymentsv1.RegisterPaymentServiceHandler(ctx, mux, conn)
//
// Register…HandlerServer calls the implementation directly, without the
// gRPC server's interceptors: idem does not run for its routes, and a
// retried POST runs again.
//
// The options set the ServeMux's incoming and outgoing header matchers,
// its outgoing trailer matcher and its error handler, each of which a
// ServeMux has only one of. To add your
// own, give an option of your own after ServeMuxOptions, wrapping yours with
// this package's, which handles idem's headers and errors and passes the rest
// on:
//
//	opts := append(idemgateway.ServeMuxOptions(),
//		runtime.WithIncomingHeaderMatcher(idemgateway.IncomingHeaderMatcher(myMatcher)),
//		runtime.WithErrorHandler(idemgateway.ErrorHandler(myErrorHandler)))
//	mux := runtime.NewServeMux(opts...)
//
// # The key
//
// The draft makes the header's value a Structured Field String, a quoted
// string:
//
//	Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"
//
// The bare form that many clients send is taken too, when it is one token
// (Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324); both name the
// same key, which must then follow idem's rule (1 to 255 visible ASCII
// characters; see [transport.ParseHTTPKey]). A value that holds more than
// one key (order-1,order-2, as a proxy joins two header lines, or a list of
// Strings) or a String with parameters is malformed. [KeyMiddleware] parses the
// header before the call and hands the gRPC server the key itself, in
// metadata idempotency-key ([idem.KeyHeader]). A malformed value, or
// more than one header, is answered at once with 400 and a problem detail
// that says what is wrong; the service is not called. This holds on every
// route of the ServeMux, including those of methods idem stands aside from.
//
// # Answers
//
//	situation                                    status  reason
//	first call, or a replay                      the response's; a replay carries Idempotent-Replayed: true
//	key missing where the method requires one    400     IDEMPOTENCY_KEY_MISSING
//	key malformed, or sent twice                 400     IDEMPOTENCY_KEY_INVALID
//	same key, different request                  422     IDEMPOTENCY_KEY_REUSED
//	same key, first request still in flight      409     IDEMPOTENCY_KEY_IN_USE, with Retry-After
//	leased call whose key a retry took over      409     IDEMPOTENCY_LEASE_LOST, with Retry-After
//	response too large to record, not rebuilt    400     IDEMPOTENCY_RESPONSE_NOT_CACHED
//	tenant or method that cannot hold a key      400     IDEMPOTENCY_SCOPE_INVALID
//	leased call whose saved steps are unreadable 500     IDEMPOTENCY_STEPS_UNREADABLE
//	abandoned call a finisher gave up on         400     IDEMPOTENCY_NOT_FINISHED
//
// A missing, reused or busy key gets the draft's status, and a malformed
// one 400; idem's other refusals get the status grpc-gateway gives their
// gRPC code (ABORTED, FAILED_PRECONDITION, INVALID_ARGUMENT, DATA_LOSS).
//
// Each of these refusals has a body of problem details (RFC 9457,
// Content-Type: application/problem+json): type, title, status, detail and
// an extension member reason, which for idem's gRPC errors is the reason of
// their google.rpc.ErrorInfo. type is a URI that names the reason, the
// documentation of its constant:
//
//	HTTP/1.1 422 Unprocessable Entity
//	Content-Type: application/problem+json
//
//	{"type":"https://pkg.go.dev/github.com/idemkit/idem#ReasonKeyReused",
//	 "title":"Idempotency-Key is already used",
//	 "status":422,
//	 "detail":"This Idempotency-Key was used with a different request to this operation; send a new key with a new request.",
//	 "reason":"IDEMPOTENCY_KEY_REUSED"}
//
// Retry-After is in seconds, the RetryInfo delay of the gRPC error rounded
// up. An error is idem's when it carries a google.rpc.ErrorInfo of domain
// idem with one of the reasons above, which the gRPC server chose: a key
// is missing or malformed as the server found it, in the header or in the
// request's key field (a string field marked (idem.v1.field).key), whether
// or not an Idempotency-Key header came. An INVALID_ARGUMENT error with a
// BadRequest field violation on idempotency-key and no such ErrorInfo (from
// a server of an earlier idem release) counts as a malformed key. Every other error, such as
// a handler's own (recorded and replayed, or not), is left to the next error
// handler, by default grpc-gateway's [runtime.DefaultHTTPErrorHandler]; a
// replayed one carries Idempotent-Replayed: true.
package idemgateway
