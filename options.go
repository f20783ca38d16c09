package idem

import (
	"context"
	"log/slog"
	"slices"
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

	policies  map[string]MethodPolicy // by full method, replacing the descriptors'
	maxStored int

	logger  *slog.Logger // nil: slog.Default()
	verbose bool

	hook func(context.Context, Report)

	uncounted bool // replays are not counted (WithReplayCounts(false))

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
		policies:   map[string]MethodPolicy{},
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

// WithReplayCounts sets whether the engine counts, per key, the calls it
// answers from the key's recorded outcome (replayed, and rebuilt by a
// Loader), for an operator to see how often a call was retried and when
// last (the admin service's key, `idem keys get`). It counts through the
// store, when the store implements [store.ReplayCounter] (PostgreSQL's
// and the in-memory store do): a replay adds to a count in memory, and
// the store writes the counts in batches, so that a replay costs no write
// of its own; a crash loses the counts not yet written. A finisher's
// calls are not counted. Default: on. Turn it off to spare the database
// the batches' writes, or to measure what counting costs.
func WithReplayCounts(on bool) Option {
	return optionFunc(func(o *options) { o.uncounted = !on })
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

// WithMaxStoredResponseBytes caps the size of a response recorded for
// replay. A larger response reaches its first caller as usual, but is
// recorded as "not cached": a retry gets it rebuilt by the method's
// [Loader] ([MethodPolicy].Loader), or runs the handler again where the
// method is declared safe to (RerunWhenNotCached), or else fails with
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

// MethodPolicy is the idempotency policy of one method, as its option
// (idem.v1.method) states it in the .proto file, field by field, plus what
// only Go can hold (a [Loader]). [WithMethodPolicy] sets it for a method
// whose .proto file carries no policy, or one the server must decide. A
// zero field means its default, as an unset field of the option does.
type MethodPolicy struct {
	// KeyRequired refuses calls without an idempotency key, with
	// INVALID_ARGUMENT. Default: a call without a key runs untouched.
	KeyRequired bool
	// Mode is how the method's keys are held while its handler runs:
	// [ModeAtomic], [ModeLeased], [ModeOptimistic] or [ModeAuto] (the
	// package documentation says when to choose each). Default:
	// ModeAtomic.
	Mode Mode
	// Lease is how long a leased call holds its key before a retry may
	// take it over (ModeLeased only: [New] refuses it with another mode).
	// Set it well above the method's p99 latency; the engine extends it
	// while the handler runs. Default: 60 s.
	Lease time.Duration
	// TTL is how long the method's keys are kept. Make it longer than any
	// client's retry window. Default: the store's (24 h for idem's stores).
	TTL time.Duration
	// Scope names the method's keys instead of its full name: keys are
	// kept under (tenant, scope, key), and child keys derive from it. Set
	// it before renaming a package, service or method, to the old full
	// name, so that keys in flight across the deploy keep their answers.
	// Two methods must never share a scope. Default: the full method name.
	Scope string
	// Finish lets a [Finisher] finish the method's leased calls when
	// their callers are gone (ModeLeased only: [New] refuses it with
	// another mode): the claim also keeps the request, and the request
	// metadata FinishHeaders names, until the outcome is recorded. A call that fails transiently then keeps its
	// claim and request, with its lease ended, rather than releasing the
	// key: a retry takes it over, or else the finisher does. The request
	// can hold personal data: it is kept only for these methods, and
	// dropped once the outcome is recorded. Default: off.
	Finish bool
	// FinishHeaders names the request metadata (such as "x-user-id")
	// kept with a call a Finisher may finish, for its handler to read when
	// the finisher runs it: what identifies the caller, say. Names are
	// matched lower-case. The tenant is always kept. It needs Finish.
	// Default: none.
	FinishHeaders []string
	// RerunWhenNotCached declares the method safe to run twice: a retry
	// whose recorded response was too large to keep
	// ([WithMaxStoredResponseBytes]), and which has no Loader, runs the
	// handler again as a plain call (no key is held and, with the
	// PostgreSQL store, no transaction is handed to it). Default: off; the
	// retry fails with FAILED_PRECONDITION.
	RerunWhenNotCached bool
	// Loader rebuilds, for a retry, a response too large to record.
	// Default: none.
	Loader Loader
	// KeepRequest records the request (its deterministic protobuf
	// encoding) with the outcome, for an operator to see what was asked:
	// the admin service's key shows it (`idem keys get`). A request larger
	// than the responses the engine records ([WithMaxStoredResponseBytes])
	// is not kept, nor is one whose response was too large to record. It
	// holds user data, personal data among it, kept for as long as the key
	// (its TTL) wherever the store keeps keys: turn it on only where that
	// is allowed. Replays do not send it, but read it with the outcome.
	// It has no field in the method's option (idem.v1.method): set it
	// here. Default: off, and the store keeps the request's fingerprint
	// alone.
	KeepRequest bool
}

// WithMethodPolicy sets the policy of the method fullMethod
// ("/pkg.Service/Method"), in place of its option (idem.v1.method): the
// whole option, so that a field left zero here means its default, never
// the value the .proto file gives. A method marked idempotency_level =
// IDEMPOTENT or NO_SIDE_EFFECTS still bypasses idem. [New] fails when
// fullMethod is not a unary method of a service in the protobuf registry,
// or when p holds a value no field takes (a Mode that is not one of
// idem's, a negative Lease or TTL). A method set twice keeps the later
// policy. Default: every method's policy is its option's.
func WithMethodPolicy(fullMethod string, p MethodPolicy) Option {
	p.FinishHeaders = slices.Clone(p.FinishHeaders)
	for i, k := range p.FinishHeaders {
		p.FinishHeaders[i] = strings.ToLower(k)
	}
	return optionFunc(func(o *options) { o.policies[fullMethod] = p })
}
