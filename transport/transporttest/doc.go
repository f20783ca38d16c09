// Package transporttest is the conformance suite of idem's adapters: one
// set of cases that every adapter (the code that puts an [idem.Engine] in
// front of one wire, see package transport) must pass, so that idem's
// contract holds the same on each wire. It is for adapter authors, as
// storetest is for store authors; a service author never imports it.
//
// # Running it
//
// Call [Run] from a test of the adapter's package with a [Harness]: a
// function that serves the suite's test service through the adapter on
// the engine it is given, with the suite's [Handler] as the service's
// implementation, and returns a [Client] that calls it over the wire:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, transporttest.HarnessFunc(func(t *testing.T, e *idem.Engine, h transporttest.Handler) transporttest.Client {
//			// serve every unary method of transporttest.Service() with h,
//			// behind the adapter built on e, and return a client of it
//		}))
//	}
//
// The package's example (ExampleRun, with its in-process adapter) is a
// whole harness in a few dozen lines; idem's own adapters' tests hold
// theirs (interceptor, idemconnect, idemgateway).
//
// Each case is a parallel subtest with an engine of its own, on a new
// store/memory store, and a server of its own, built with the subtest's t:
// register cleanups (stopping the server) on it. A Harness whose adapter
// also keys outgoing calls implements [OutgoingHarness], and the cases of
// outgoing keys run too.
//
// # What it covers
//
// Every case counts the runs of the handler and asserts them. A key
// missing where it is required, malformed (empty, too long, with a space,
// sent twice), or given in the request's key field and the metadata with
// two values: refused with INVALID_ARGUMENT and idem's reason (and, on a
// wire that carries error details, a BadRequest violation on the key), the
// handler never run; a method without side effects runs without a key and ignores a
// valid one. The first call runs the handler once and answers, not marked
// replayed; its retry gets the same bytes, marked replayed, and the handler
// does not run again, also with a field excluded from the fingerprint
// changed. The same key with another request: FAILED_PRECONDITION,
// KEY_REUSED. A duplicate while the first call runs: ABORTED, KEY_IN_USE,
// with a retry hint. A transient error of the handler: sent as it is and
// the key released, so that the retry runs the handler again. A
// deterministic error: recorded and replayed with its code, message and
// details. The headers and trailers the handler set: sent with the first
// answer and replayed, with a response and with an error. A key sent in
// the request's key field alone works as the metadata's, and a key sent in
// the metadata alone reaches the handler in that field. Keys are scoped by
// the tenant the request metadata names. With [OutgoingHarness]: a call
// made inside a keyed handler carries the child key idem derives, the same
// on the handler's every retry.
//
// What is each wire's own stays in the adapter's tests: the syntax of its
// headers (a malformed HTTP Structured Field), its refusal of keyed
// streams, its error bodies, its retries.
package transporttest
