// Package interceptor is idem's gRPC adapter: it runs the mutating unary
// calls of a grpc-go server through an [idem.Engine], so that they are safe
// to retry, and attaches idempotency keys on the client side. Package idem
// describes the flow, the status codes, the modes and the options; a
// program needs it and this package only. The adapter is built on package
// [github.com/idemkit/idem/transport], as each of idem's adapters is, and
// is the shortest example of one.
//
// # Server
//
// [UnaryServerInterceptor] hands each unary call to the engine, with the
// key from metadata [idem.KeyHeader] and the request metadata, and sends
// its answer: the response, or idem's refusal or recorded error as a gRPC
// status, with the response metadata the handler set (recorded with the
// outcome, sent again with every replay). Add it to the server's chain,
// after authentication (the tenant comes from the caller's identity) and
// inside recovery (a panic releases the key and continues up the chain):
//
//	engine, err := idem.New(postgres.New(pool), idem.WithTenant(tenantOf))
//	if err != nil {
//		return err
//	}
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(
//			recovery.UnaryServerInterceptor(),
//			auth.UnaryServerInterceptor(authenticate),
//			interceptor.UnaryServerInterceptor(engine),
//		),
//		grpc.ChainStreamInterceptor(interceptor.StreamServerInterceptor()),
//	)
//
// [StreamServerInterceptor] refuses a streaming call that carries a key
// with INVALID_ARGUMENT, since idem makes unary calls safe to retry.
//
// When idem answers with a RetryInfo of its own (a key in use, a lease
// lost, a store that failed) the interceptor also sends the trailer
// grpc-retry-pushback-ms (gRFC A6), so that grpc-go's own retry policy waits as long as
// the server asks.
//
// The fields idem.result and idem.replayed are added to the fields of
// go-grpc-middleware v2's logging interceptor, which prints them on its
// "finished call" line, when it comes before idem in the chain. It keeps
// its fields in the context it hands down the chain, where idem adds its
// own when the call is settled:
//
//	grpc.ChainUnaryInterceptor(
//		logging.UnaryServerInterceptor(logger), // go-grpc-middleware v2
//		recovery.UnaryServerInterceptor(),
//		interceptor.UnaryServerInterceptor(engine),
//	)
//
// # Finishing abandoned calls
//
// [FinisherRegistrar] registers a server's services with an [idem.Finisher],
// which runs abandoned leased calls again through the same chain:
//
//	f, err := idem.NewFinisher(engine)
//	paymentsv1.RegisterPaymentServiceServer(interceptor.FinisherRegistrar(f), svc)
//	go f.Run(ctx)
//
// # Admin service
//
// [RegisterAdmin] serves idem's admin service (package admin) on a grpc-go
// server, for operators, on a listener of its own:
//
//	s := grpc.NewServer(grpc.Creds(operatorsTLS))
//	interceptor.RegisterAdmin(s, admin.NewServer(st, authorize, opts...))
//
// The service's authorizer gets the call's metadata and TLS state, and its
// answers go as gRPC statuses; package idemconnect serves the same service
// over Connect.
//
// # Client
//
// [UnaryClientInterceptor] attaches keys to the calls of keyed methods, as
// package idem's documentation ("Calling other services") gives them: a new key per logical call, or a child key
// derived from the request being handled. A request whose field marked
// (idem.v1.field).key (a request_id) is empty carries the key there as
// well, on a copy of the message, as AIP-4235 has client libraries fill it;
// one whose field is set is sent with that key alone. Put it before any retry
// interceptor in the client's chain, so that the key is attached once and
// every attempt carries it:
//
//	grpc.WithChainUnaryInterceptor(
//		interceptor.UnaryClientInterceptor(),
//		retry.UnaryClientInterceptor( // go-grpc-middleware v2
//			retry.WithCodes(codes.Aborted, codes.Unavailable),
//			retry.WithBackoff(interceptor.BackoffRetryInfo(retry.BackoffExponential(50*time.Millisecond)))),
//	)
//
// grpc-go's own retries (a retryPolicy in the service config, listing
// ABORTED and UNAVAILABLE) run below every interceptor and resend the same
// metadata and message. [BackoffRetryInfo] makes the retry interceptor wait as long as
// the server's RetryInfo asks; [RetryDelay] reads it for hand-written
// loops. Neither retrier sees the response metadata idempotent-replayed,
// so a recorded error of a code they retry (only a classifier that records
// ABORTED or UNAVAILABLE makes one) is sent again up to their limit, and
// replayed each time. connect-go clients have the same recipe in one
// interceptor, idemconnect.NewRetryInterceptor, which returns such a
// replay at once. Streaming calls are not intercepted by the client
// interceptor and pass through untouched.
//
// With a key it made, the client interceptor marks the call as the key's
// first attempt (metadata idem.AttemptHeader, 1), for servers whose
// methods are in idem.ModeAuto; both retriers add their own mark of a
// retry to the attempts after the first (grpc-previous-rpc-attempts,
// x-retry-attempt), which the server takes over the first attempt's.
package interceptor
