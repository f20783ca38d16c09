package interceptor

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/fingerprint"
)

// DefaultRetryDelay is the delay suggested in RetryInfo when a key is in use.
const DefaultRetryDelay = time.Second

type options struct {
	tenant      TenantResolver
	classifier  Classifier
	retryDelay  time.Duration
	fingerprint []fingerprint.Option

	// client holds the options of UnaryClientInterceptor (client_options.go).
	client clientOptions
}

var defaultOptions = options{
	tenant:     TenantFunc(func(context.Context) (string, error) { return "", nil }),
	classifier: DefaultClassifier,
	retryDelay: DefaultRetryDelay,
}

// Option configures [UnaryServerInterceptor] or [UnaryClientInterceptor];
// each option says which one it applies to, and the other ignores it.
type Option func(*options)

func evaluateOptions(opts []Option) *options {
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
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
func WithTenant(r TenantResolver) Option {
	return func(o *options) { o.tenant = r }
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
func WithClassifier(c Classifier) Option {
	return func(o *options) { o.classifier = c }
}

// WithRetryDelay sets the delay suggested in google.rpc.RetryInfo when a
// request's key is held by a request still in flight. Default:
// [DefaultRetryDelay] (1 s).
func WithRetryDelay(d time.Duration) Option {
	return func(o *options) { o.retryDelay = d }
}

// WithFingerprintOptions configures the request fingerprint, for example to
// exclude fields of messages that cannot be annotated with the
// (idem.v1.field).fingerprint_exclude option. Default: none.
func WithFingerprintOptions(opts ...fingerprint.Option) Option {
	return func(o *options) { o.fingerprint = append(o.fingerprint, opts...) }
}
