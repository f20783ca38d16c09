// Package transport is for the authors of idem's adapters: the code that
// puts an [idem.Engine] in front of one wire (gRPC, Connect, HTTP) and
// maps that wire to the engine and back. A service or client author never
// imports it: they build an engine with [idem.New] and hand it to an
// adapter (package interceptor for grpc-go, idemconnect for connect-go,
// idemgateway for grpc-gateway), which is built on this package.
//
// The engine knows no wire. An adapter gives it a [Call] (the method, the
// key as the wire carried it, the request, the request metadata, and how
// to read a status from the wire's errors) and a [Handler] that runs the
// wire's handler; [Handle] returns an [Answer] and an error, which the
// adapter sends its wire's way. The engine decides everything else: the
// key's validity, the claim, the record, the replay, the status of every
// refusal.
//
// # Writing an adapter
//
// A server adapter, per unary call:
//
//  1. Read the key: gRPC metadata [idem.KeyHeader] as it is, an HTTP
//     header [idem.HTTPKeyHeader] with [ParseHTTPKey] (a value that does
//     not parse goes in Call.KeyError, so that the engine refuses it as it
//     refuses any malformed key). Put the request metadata in Call.Header
//     with lower-case names.
//  2. Call [Handle] with a Handler that runs the wire's handler with the
//     context it is given (it carries the key's transaction and lease)
//     and returns the response and the response metadata the handler set.
//  3. Send the answer: on success [Answer.WireMessage] to a binary protobuf
//     codec (the recorded bytes exactly), Answer.Message to any other; the
//     metadata in Answer.Header and Answer.Trailer; an [*idem.Error] as the
//     wire sends a google.rpc.Status ([idem.Error.Status], and an HTTP
//     Retry-After from [idem.Error.RetryAfter]); any other error as the
//     handler's own.
//  4. Refuse a key on a streaming call with [StreamKeyRefused].
//
// A client adapter calls [OutgoingKeys.For] once per logical call, sends
// the request it returns, and writes the keys in its wire's syntax
// ([FormatHTTPKey] for HTTP). To let an [idem.Finisher] run abandoned
// calls again, register each method with [RegisterFinish]: its
// [FinishFunc] builds the wire's request from the kept one and runs it
// through the same handler chain and [Handle].
//
// Package interceptor (grpc-go) is the shortest complete example;
// idemconnect shows an HTTP wire with three protocols. Test an adapter with
// the conformance suite of package transporttest, which every adapter of
// idem's passes.
package transport
