// Package idemconnect makes mutating unary connect-go calls safe to retry,
// with the contract, store and options of idem's gRPC interceptors
// (package interceptor), over the three protocols a connect-go handler
// serves: Connect, gRPC and gRPC-Web.
//
// It is a package of idem's module: connect-go requires only protobuf and
// go-cmp, so programs that use idem with grpc-go only build none of it, and
// it builds on idem's transport-neutral core (package [idem], through the
// adapters' package [github.com/idemkit/idem/transport]), so a
// Connect-only program builds none of grpc-go. A program needs package
// idem and this package only.
//
// # Handlers
//
// [NewInterceptor] runs an [idem.Engine], built with [idem.New] from the
// store and the options ([idem.Option]) that grpc-go's interceptor takes
// too: one fingerprint, one classifier, one scope (tenant,
// full method name, key), the methods' proto options, the same status
// codes and google.rpc details, sent as a *connect.Error with the same
// code, message and details (connect.ErrorDetail). A gRPC call and its
// retry over Connect or HTTP, served on the same store, are one operation:
// the retry replays the first call's answer.
//
//	mux := http.NewServeMux()
//	mux.Handle(paymentsv1connect.NewPaymentServiceHandler(svc,
//		connect.WithInterceptors(
//			authn,                                   // first: the tenant comes from the caller
//			idemconnect.NewInterceptor(engine),     // engine, err := idem.New(postgres.New(pool), idem.WithTenant(tenantOf))
//		)))
//
// In a handler, write on the transaction that holds the key, from
// postgres.TxFromContext, as under grpc-go.
//
// # Keys on each protocol
//
// Clients send the key in the request header Idempotency-Key. Over Connect
// (including a plain HTTP POST of JSON) and gRPC-Web it is read as the
// IETF draft (draft-ietf-httpapi-idempotency-key-header) writes it, a
// quoted Structured Field String, or the bare token many clients send:
//
//	curl -H 'Content-Type: application/json' -H 'Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"' \
//		-d '{"customerId":"cus_1","amountCents":1250}' https://api.example.com/payments.v1.PaymentService/CreatePayment
//
// Over gRPC it is the metadata idempotency-key ([idem.KeyHeader]),
// read as it is, as grpc-go's interceptor reads it. The two names are one
// HTTP header field, so no precedence orders them: a request with more than
// one value is refused with INVALID_ARGUMENT, as on grpc-go, and so is a
// value that is neither one Structured Field String nor one token (such as
// k1,k2, two values joined by a proxy), with a message that says what is
// wrong with it. Methods idem stands aside from (IDEMPOTENT,
// NO_SIDE_EFFECTS) ignore a well-formed key but refuse a malformed one
// likewise.
//
// A replay carries the response header Idempotent-Replayed: true
// ([idem.HTTPReplayedHeader]), which gRPC clients read as metadata
// idempotent-replayed. Over Connect, an answer that suggests a retry delay
// (ABORTED for a key still in use, UNAVAILABLE) also carries Retry-After,
// in whole seconds. The HTTP status codes are Connect's own (400 for
// INVALID_ARGUMENT and FAILED_PRECONDITION, 409 for ABORTED); clients read
// the code and the details from the body.
//
// # Tenants
//
// The tenant resolver ([idem.WithTenant]) gets the request headers as gRPC
// metadata carries them (lower-case names, the values of -bin names
// decoded, the key decoded), so that one resolver serves grpc-go and
// connect-go alike:
//
//	tenantOf := func(ctx context.Context, header map[string][]string) (string, error) {
//		return strings.Join(header["x-tenant-id"], ""), nil // derive it from verified credentials in production
//	}
//
// # Responses
//
// The response of a replay is the recorded one: with the binary protobuf
// codec, the recorded bytes exactly; with JSON and other codecs, the
// recorded message, encoded again. A replayed response is not the method's
// response type for interceptors placed outside idem's (connect-go builds a
// response from its concrete type, which an interceptor does not know), but
// a [proto.Message] of the same descriptor; place idem's interceptor after
// those that type-assert responses.
//
// # Streams
//
// idem handles unary calls. A streaming call that carries a key is refused
// with INVALID_ARGUMENT, saying that keys apply to unary methods; one
// without passes through.
//
// # Abandoned calls
//
// A leased call of a method that may be finished ([idem.MethodPolicy].Finish) whose
// caller went away is finished by an [idem.Finisher], through the handler
// registered with [FinishHandler]:
//
//	f, err := idem.NewFinisher(engine)
//	idemconnect.FinishHandler(f, paymentsv1connect.PaymentServiceCreatePaymentProcedure, svc.CreatePayment)
//	go f.Run(ctx)
//
// # Admin service
//
// [NewAdminHandler] serves idem's admin service (package admin, also served
// over grpc-go by interceptor.RegisterAdmin) for operators, on a listener
// of its own, with no grpc-go in the program:
//
//	ops := http.NewServeMux()
//	ops.Handle(idemconnect.NewAdminHandler(admin.NewServer(st, authorize, opts...)))
//
// The service's authorizer gets the request headers, as the tenant
// resolver does, and the TLS state; its answers go as *connect.Error. The
// idem command calls it with -protocol connect; curl, with JSON, as any
// Connect handler.
//
// # Clients
//
// [NewClientInterceptor] does what grpc-go's client interceptor (package
// interceptor) does: one key per logical call, kept by every retry made by
// interceptors placed after it, and child keys derived from the request's
// inside a keyed handler, so that a retried handler's calls are
// deduplicated too. A request whose field marked (idem.v1.field).key (a
// request_id) is empty carries the key there as well, on a copy of the
// message, as AIP-4235 has client libraries fill it.
//
// [NewRetryInterceptor] retries, with that key, a call answered ABORTED or
// UNAVAILABLE (a key still in flight, a store that failed), waiting as long
// as the answer's RetryInfo asks ([RetryDelay] reads it), at most 5
// attempts within the call's deadline; it returns any other answer, and a
// replayed one, at once. connect-go has no retry interceptor of its own;
// this one follows the rules of the gRPC recipe in package interceptor:
//
//	client := paymentsv1connect.NewPaymentServiceClient(http.DefaultClient, baseURL,
//		connect.WithInterceptors(
//			idemconnect.NewClientInterceptor(), // first: one key per logical call
//			idemconnect.NewRetryInterceptor(),  // then the retries, each with that key
//		))
//
// For servers whose methods are in idem.ModeAuto, the two mark each
// attempt in the header Idempotency-Attempt ([idem.HTTPAttemptHeader]): the
// client interceptor 1 on a call whose key it made, the retry interceptor
// 2, 3 and so on on its attempts after the first.
package idemconnect
