package idem

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/fingerprint"
)

// Defaults of the options below.
const (
	defaultRetryDelay = time.Second
	defaultLease      = 60 * time.Second
	defaultMaxStored  = 1 << 20
)

// An Option configures an [Engine].
type Option interface {
	apply(*options)
}

// An ObserveOption configures both an [Engine] and the outgoing keys of a
// client ([ClientOption]).
type ObserveOption interface {
	Option
	ClientOption
}

type options struct {
	tenant      func(context.Context, map[string][]string) (string, error)
	classifier  func(*spb.Status) bool
	retryDelay  time.Duration
	fingerprint []fingerprint.Option

	leases     map[string]time.Duration // leased methods and their leases (0: default)
	optimistic map[string]bool          // methods in optimistic mode
	maxStored  int
	loaders    map[string]Loader
	rerun      map[string]bool

	logger  *slog.Logger // nil: slog.Default()
	verbose bool

	hook func(context.Context, Outcome)

	finish        map[string]bool // methods whose leased calls a Finisher may finish
	finishHeaders []string        // request metadata kept for it

	meterProvider  metric.MeterProvider // nil: otel.GetMeterProvider()
	tracerProvider trace.TracerProvider // nil: otel.GetTracerProvider()
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

func evaluateOptions(opts []Option) *options {
	o := &options{
		tenant:     func(context.Context, map[string][]string) (string, error) { return "", nil },
		classifier: deterministic,
		retryDelay: defaultRetryDelay,
		maxStored:  defaultMaxStored,
		leases:     map[string]time.Duration{},
		optimistic: map[string]bool{},
		loaders:    map[string]Loader{},
		rerun:      map[string]bool{},
		finish:     map[string]bool{},
	}
	for _, opt := range opts {
		opt.apply(o)
	}
	return o
}

// WithTenant sets how the tenant of a request is found, from the call's
// context and request metadata (lower-case names, whatever the transport).
// Keys are scoped by tenant: the same key from two tenants names two
// independent operations. Derive it from the caller's authenticated
// identity (a verified token, a client certificate), never only from a
// value the client can choose freely. An error refuses the call: one that
// carries a status (an [*Error], a gRPC status error, a *connect.Error) as
// it is, any other as UNAUTHENTICATED. Default: every caller
// shares one scope, the empty tenant.
func WithTenant(tenant func(ctx context.Context, header map[string][]string) (string, error)) Option {
	return optionFunc(func(o *options) { o.tenant = tenant })
}

// WithLogger sets where the engine logs what clients are not told: the full
// errors of the store behind an UNAVAILABLE answer, records that cannot be
// replayed, leases lost to a retry. A healthy server logs nothing per
// request. Default: [slog.Default], as it is when a line is logged; nil
// selects the default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.logger = l })
}

// WithVerboseErrors puts the text of internal errors (the store's, a
// [Loader]'s, a failure to encode the response) into the messages clients
// get, for development. Leave it off in production: the text can name
// database hosts, users and tables. Either way the full error is logged
// ([WithLogger]). Default: off; clients get a message that names only what
// idem was doing.
func WithVerboseErrors(on bool) Option {
	return optionFunc(func(o *options) { o.verbose = on })
}

func (o *options) log() *slog.Logger {
	if o.logger == nil {
		return slog.Default()
	}
	return o.logger
}

// deterministic is the default classifier: INVALID_ARGUMENT,
// FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS and NOT_FOUND are
// deterministic, every other code transient.
func deterministic(s *spb.Status) bool {
	switch code.Code(s.GetCode()) {
	case code.Code_INVALID_ARGUMENT, code.Code_FAILED_PRECONDITION, code.Code_OUT_OF_RANGE,
		code.Code_ALREADY_EXISTS, code.Code_NOT_FOUND:
		return true
	}
	return false
}

// WithClassifier sets which handler errors are deterministic: the same
// request would fail the same way again, so the error is recorded and
// replayed to retries. Any other error is transient: the claim is released,
// nothing is recorded and a retry runs the handler again. The function gets
// the error as its transport sends it. Default: INVALID_ARGUMENT,
// FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS and NOT_FOUND are
// deterministic; every other code is transient (UNAUTHENTICATED too, so
// that a client that refreshes its token can retry).
func WithClassifier(deterministic func(*spb.Status) bool) Option {
	return optionFunc(func(o *options) { o.classifier = deterministic })
}

// WithRetryDelay sets the delay suggested in google.rpc.RetryInfo when a
// request's key is held by a request still in flight, and when the store
// failed (UNAVAILABLE). Default: 1 s.
func WithRetryDelay(d time.Duration) Option {
	return optionFunc(func(o *options) { o.retryDelay = d })
}

// WithFingerprintOptions configures the request fingerprint, for example to
// exclude fields of messages that cannot be annotated with the
// (idem.v1.field).fingerprint_exclude option. Default: none.
func WithFingerprintOptions(opts ...fingerprint.Option) Option {
	return optionFunc(func(o *options) { o.fingerprint = append(o.fingerprint, opts...) })
}

// WithLeased puts the named methods ("/pkg.Service/Method") in leased mode,
// holding their keys for lease (0 selects the method's proto option
// (idem.v1.method).lease, else 60 s). The same is declared in the .proto
// file with option (idem.v1.method).mode = MODE_LEASED. See the package
// documentation for when to choose it. Default: every method is atomic.
func WithLeased(lease time.Duration, fullMethods ...string) Option {
	return optionFunc(func(o *options) {
		for _, m := range fullMethods {
			o.leases[m] = max(lease, 0)
		}
	})
}

// WithOptimistic puts the named methods ("/pkg.Service/Method") in
// optimistic mode: as in atomic mode, the handler's writes and the outcome
// commit in one transaction, but the key is not read before the handler
// runs. The outcome's record writes the key's row only where there is
// none; where another request has written it, the handler's writes are
// rolled back and the call claims the key as in atomic mode: it answers
// from that request's outcome, as a retry would, or, where the row has
// expired, runs the handler again. A first execution saves the read, the
// table lock and the key's lock of atomic mode; a retry of a recorded key,
// or a duplicate running alongside, costs a run of the handler that is
// rolled back, and a replay answers after the handler instead of at once.
// Choose it only for handlers whose every effect is in the transaction
// (no call to another service, no message sent) and whose retries are
// rare; BENCHMARKS.md has the figures. The same is declared in the .proto
// file with option (idem.v1.method).mode = MODE_OPTIMISTIC. A method in
// leased mode, by [WithLeased] or its .proto, stays leased. Default: none.
func WithOptimistic(fullMethods ...string) Option {
	return optionFunc(func(o *options) {
		for _, m := range fullMethods {
			o.optimistic[m] = true
		}
	})
}

// WithMaxStoredResponseBytes caps the size of a response recorded for
// replay. A larger response reaches its first caller as usual, but is
// recorded as "not cached": a retry gets it rebuilt by the method's
// [Loader] ([WithLoader]), or runs the handler again where the method is
// declared safe to ([WithRerunWhenNotCached]), or else fails with
// FAILED_PRECONDITION. Recorded errors are not capped. Default: 1 MiB;
// n <= 0 selects the default.
func WithMaxStoredResponseBytes(n int) Option {
	return optionFunc(func(o *options) {
		if n <= 0 {
			n = defaultMaxStored
		}
		o.maxStored = n
	})
}

// Loader rebuilds, for a retry, a response that was too large to record
// (see [WithMaxStoredResponseBytes]). Reference, don't copy: record what
// finds the response again, such as the id of the row the call created.
type Loader interface {
	// Reference returns what to record in place of resp. It runs in the
	// handler's transaction, after the handler. An error fails the call
	// as a transient one: nothing is recorded.
	Reference(ctx context.Context, resp proto.Message) ([]byte, error)
	// Load rebuilds the response from what Reference returned. An error
	// that carries a status (an [*Error], a gRPC status error, a
	// *connect.Error) reaches the client as it is; any other is answered
	// UNAVAILABLE.
	Load(ctx context.Context, ref []byte) (proto.Message, error)
}

// WithLoader sets the [Loader] of the method fullMethod
// ("/pkg.Service/Method"). Default: none.
func WithLoader(fullMethod string, l Loader) Option {
	return optionFunc(func(o *options) { o.loaders[fullMethod] = l })
}

// WithRerunWhenNotCached declares the named methods safe to run twice: a
// retry whose recorded response was too large to keep, and which has no
// [Loader], runs the handler again as a plain call (no key is held and, with
// the PostgreSQL store, no transaction is handed to it). The same is
// declared in the .proto file with option
// (idem.v1.method).rerun_when_not_cached = true. Default: none.
func WithRerunWhenNotCached(fullMethods ...string) Option {
	return optionFunc(func(o *options) {
		for _, m := range fullMethods {
			o.rerun[m] = true
		}
	})
}

// WithFinish lets a [Finisher] finish the leased calls of the named
// methods ("/pkg.Service/Method") when their callers are gone: the claim
// also keeps the request, and the request metadata named with
// [WithFinishHeaders], until the outcome is recorded. The same is declared
// in the .proto file with option (idem.v1.method).finish = true. It has no
// effect on methods in atomic mode, whose calls are never left half done.
// A call of these methods that fails transiently keeps its claim and
// request, with its lease ended, rather than releasing the key: a retry
// takes it over, or else the finisher does. The request can hold personal
// data: it is kept only for these methods, and dropped once the outcome is
// recorded. Default: none.
func WithFinish(fullMethods ...string) Option {
	return optionFunc(func(o *options) {
		for _, m := range fullMethods {
			o.finish[m] = true
		}
	})
}

// WithFinishHeaders names the request metadata (lower-case names, such as
// "x-user-id") kept with a call a [Finisher] may finish, for its handler to
// read when the finisher runs it: what identifies the caller, say. The
// tenant is always kept. Default: none.
func WithFinishHeaders(names ...string) Option {
	return optionFunc(func(o *options) {
		for _, k := range names {
			o.finishHeaders = append(o.finishHeaders, strings.ToLower(k))
		}
	})
}
