package interceptor

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/fingerprint"
)

// Defaults of the options below.
const (
	// DefaultRetryDelay is the delay suggested in RetryInfo when a key is in
	// use or the store failed.
	DefaultRetryDelay = time.Second
	// DefaultLease is how long a leased call holds its key.
	DefaultLease = 60 * time.Second
	// DefaultMaxStoredResponseBytes is the largest response recorded as it
	// is: 1 MiB.
	DefaultMaxStoredResponseBytes = 1 << 20
)

type serverOptions struct {
	tenant      TenantResolver
	classifier  Classifier
	retryDelay  time.Duration
	fingerprint []fingerprint.Option

	leases    map[string]time.Duration // leased methods and their leases (0: default)
	maxStored int
	loaders   map[string]Loader
	rerun     map[string]bool

	logger  *slog.Logger // nil: slog.Default()
	verbose bool

	hook func(context.Context, Outcome)

	complete         map[string]bool // methods whose leased calls a Completer may finish
	completeMetadata []string        // request metadata kept for it

	meterProvider  metric.MeterProvider // nil: otel.GetMeterProvider()
	tracerProvider trace.TracerProvider // nil: otel.GetTracerProvider()
}

var defaultServerOptions = serverOptions{
	tenant:     TenantFunc(func(context.Context) (string, error) { return "", nil }),
	classifier: DefaultClassifier,
	retryDelay: DefaultRetryDelay,
	maxStored:  DefaultMaxStoredResponseBytes,
}

// ServerOption configures [UnaryServerInterceptor]. The With functions that
// return one say what they set and its default.
type ServerOption interface {
	applyServer(*serverOptions)
}

// ClientOption configures [UnaryClientInterceptor].
type ClientOption interface {
	applyClient(*clientOptions)
}

// Option configures the server and the client interceptors alike; it is
// both a [ServerOption] and a [ClientOption].
type Option interface {
	ServerOption
	ClientOption
}

// serverOption is a ServerOption that is a function.
type serverOption func(*serverOptions)

func (f serverOption) applyServer(o *serverOptions) { f(o) }

// clientOption is a ClientOption that is a function.
type clientOption func(*clientOptions)

func (f clientOption) applyClient(o *clientOptions) { f(o) }

// option is an Option: what it sets on each side.
type option struct {
	server serverOption
	client clientOption
}

func (o option) applyServer(s *serverOptions) { o.server(s) }
func (o option) applyClient(c *clientOptions) { o.client(c) }

func evaluateServerOptions(opts []ServerOption) *serverOptions {
	o := defaultServerOptions
	o.leases = map[string]time.Duration{}
	o.loaders = map[string]Loader{}
	o.rerun = map[string]bool{}
	o.complete = map[string]bool{}
	for _, opt := range opts {
		opt.applyServer(&o)
	}
	return &o
}

// TenantResolver tells which tenant a request belongs to. Keys are scoped by
// tenant: the same key from two tenants names two independent operations.
type TenantResolver interface {
	// Tenant returns the caller's tenant. An error fails the call: a status
	// error as it is, any other as UNAUTHENTICATED.
	Tenant(ctx context.Context) (string, error)
}

// TenantFunc adapts a function to a [TenantResolver].
type TenantFunc func(ctx context.Context) (string, error)

// Tenant calls f(ctx).
func (f TenantFunc) Tenant(ctx context.Context) (string, error) { return f(ctx) }

// WithTenant sets how the tenant of a request is found. Derive it from the
// caller's authenticated identity (a verified token, a client certificate),
// never only from a value the client can choose freely. Default: every
// caller shares one scope, the empty tenant.
func WithTenant(r TenantResolver) ServerOption {
	return serverOption(func(o *serverOptions) { o.tenant = r })
}

// WithLogger sets where the server interceptor logs what clients are not
// told: the full errors of the store behind an UNAVAILABLE answer, records
// that cannot be replayed, leases lost to a retry. A healthy server logs
// nothing per request. Default: [slog.Default], as it is when a line is
// logged; nil selects the default.
func WithLogger(l *slog.Logger) ServerOption {
	return serverOption(func(o *serverOptions) { o.logger = l })
}

// WithVerboseErrors makes the server interceptor put the text of internal
// errors (the store's, a [Loader]'s, a failure to encode the response) into
// the messages clients get, for development. Leave it off in production: the text can name
// database hosts, users and tables. Either way the full error is logged
// ([WithLogger]). Default: off; clients get a message that names only what
// idem was doing.
func WithVerboseErrors(on bool) ServerOption {
	return serverOption(func(o *serverOptions) { o.verbose = on })
}

// log returns the logger of o.
func (o *serverOptions) log() *slog.Logger {
	if o.logger == nil {
		return slog.Default()
	}
	return o.logger
}

// Classifier decides which handler errors are deterministic: the same
// request would fail the same way again, so the error is recorded and
// replayed to retries. Any other error is transient: the claim is released,
// nothing is recorded and a retry runs the handler again.
type Classifier interface {
	Deterministic(s *status.Status) bool
}

// ClassifierFunc adapts a function to a [Classifier].
type ClassifierFunc func(s *status.Status) bool

// Deterministic calls f(s).
func (f ClassifierFunc) Deterministic(s *status.Status) bool { return f(s) }

// DefaultClassifier treats INVALID_ARGUMENT, FAILED_PRECONDITION,
// OUT_OF_RANGE, ALREADY_EXISTS and NOT_FOUND as deterministic and every other
// code as transient; UNAUTHENTICATED is transient so that a client that
// refreshes its token can retry.
var DefaultClassifier Classifier = ClassifierFunc(func(s *status.Status) bool {
	switch s.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange,
		codes.AlreadyExists, codes.NotFound:
		return true
	}
	return false
})

// WithClassifier sets which handler errors are recorded and replayed.
// Default: [DefaultClassifier].
func WithClassifier(c Classifier) ServerOption {
	return serverOption(func(o *serverOptions) { o.classifier = c })
}

// WithRetryDelay sets the delay suggested in google.rpc.RetryInfo when a
// request's key is held by a request still in flight, and when the store
// failed (UNAVAILABLE). Default: [DefaultRetryDelay] (1 s).
func WithRetryDelay(d time.Duration) ServerOption {
	return serverOption(func(o *serverOptions) { o.retryDelay = d })
}

// WithFingerprintOptions configures the request fingerprint, for example to
// exclude fields of messages that cannot be annotated with the
// (idem.v1.field).fingerprint_exclude option. Default: none.
func WithFingerprintOptions(opts ...fingerprint.Option) ServerOption {
	return serverOption(func(o *serverOptions) { o.fingerprint = append(o.fingerprint, opts...) })
}

// WithLeased puts the named methods ("/pkg.Service/Method") in leased mode,
// holding their keys for lease (0 selects the method's proto option
// (idem.v1.method).lease, else [DefaultLease]). The same is declared in the
// .proto file with option (idem.v1.method).mode = MODE_LEASED. See the
// package documentation for when to choose it. Default: every method is
// atomic.
func WithLeased(lease time.Duration, fullMethods ...string) ServerOption {
	return serverOption(func(o *serverOptions) {
		for _, m := range fullMethods {
			o.leases[m] = max(lease, 0)
		}
	})
}

// WithMaxStoredResponseBytes caps the size of a response recorded for
// replay. A larger response reaches its first caller as usual, but is
// recorded as "not cached": a retry gets it rebuilt by the method's
// [Loader] ([WithLoader]), or runs the handler again where the method is
// declared safe to ([WithRerunWhenNotCached]), or else fails with
// FAILED_PRECONDITION. Recorded errors are not capped. Default:
// [DefaultMaxStoredResponseBytes] (1 MiB); n <= 0 selects the default.
func WithMaxStoredResponseBytes(n int) ServerOption {
	return serverOption(func(o *serverOptions) {
		if n <= 0 {
			n = DefaultMaxStoredResponseBytes
		}
		o.maxStored = n
	})
}

// Loader rebuilds, for a retry, a response that was too large to record
// (see [WithMaxStoredResponseBytes]). Reference, don't copy: record what
// finds the response again, such as the id of the row the call created.
type Loader interface {
	// Reference returns what to record in place of resp. It runs after the
	// handler, in its context (with the PostgreSQL store, inside the
	// transaction that holds the key); an error fails the call with that
	// error and releases the key, as a transient handler error does.
	Reference(ctx context.Context, resp proto.Message) ([]byte, error)
	// Load rebuilds the response from the recorded reference. An error
	// fails the retry: a status error as it is, any other as UNAVAILABLE,
	// whose message does not carry the error's text (it is logged; see
	// [WithVerboseErrors]).
	Load(ctx context.Context, ref []byte) (proto.Message, error)
}

// WithLoader sets the [Loader] of the method fullMethod
// ("/pkg.Service/Method"). Default: none.
func WithLoader(fullMethod string, l Loader) ServerOption {
	return serverOption(func(o *serverOptions) { o.loaders[fullMethod] = l })
}

// WithRerunWhenNotCached declares the named methods safe to run twice: a
// retry whose recorded response was too large to keep, and which has no
// [Loader], runs the handler again as a plain call (no key is held and, with
// the PostgreSQL store, no transaction is handed to it). The same is
// declared in the .proto file with option
// (idem.v1.method).rerun_when_not_cached = true. Default: none.
func WithRerunWhenNotCached(fullMethods ...string) ServerOption {
	return serverOption(func(o *serverOptions) {
		for _, m := range fullMethods {
			o.rerun[m] = true
		}
	})
}

// WithCompletion lets a [Completer] finish the leased calls of the named
// methods ("/pkg.Service/Method") when their callers are gone: the claim
// also keeps the request, and the request metadata named with
// [WithCompletionMetadata], until the outcome is recorded. The same is
// declared in the .proto file with option (idem.v1.method).complete = true.
// It has no effect on methods in atomic mode, whose calls are never left
// half done. A call of these methods that fails transiently keeps its claim
// and request, with its lease ended, rather than releasing the key: a retry
// takes it over, or else the completer does. The request can hold personal
// data: it is kept only for these methods, and dropped once the outcome is
// recorded. Default: none.
func WithCompletion(fullMethods ...string) ServerOption {
	return serverOption(func(o *serverOptions) {
		for _, m := range fullMethods {
			o.complete[m] = true
		}
	})
}

// WithCompletionMetadata names the request metadata (lower-case keys, such
// as "x-user-id") kept with a completable call, for its handler to read when
// a [Completer] runs it: what identifies the caller, say. The tenant is
// always kept. Default: none.
func WithCompletionMetadata(keys ...string) ServerOption {
	return serverOption(func(o *serverOptions) {
		for _, k := range keys {
			o.completeMetadata = append(o.completeMetadata, strings.ToLower(k))
		}
	})
}
