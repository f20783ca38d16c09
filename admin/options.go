package admin

import (
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// An Option configures a [Server].
type Option func(*options)

type options struct {
	tokenKey       []byte               // nil: a random key per Server
	logger         *slog.Logger         // nil: slog.Default()
	tracerProvider trace.TracerProvider // nil: otel.GetTracerProvider()
	finisher       *idem.Finisher       // nil: FinishKey is UNIMPLEMENTED
}

// minTokenKeyLength is the shortest key WithPageTokenKey accepts: that of
// the HMAC-SHA256 digest.
const minTokenKeyLength = 32

// WithPageTokenKey sets the secret key that signs ListKeys's page tokens,
// at least 32 bytes ([NewServer] panics on a shorter one). Give every
// replica of the service the same key, so that a page token one issued is
// accepted by the others and after a restart. Default: a random key drawn
// by each Server, whose tokens only that Server accepts.
func WithPageTokenKey(key []byte) Option {
	return func(o *options) { o.tokenKey = append([]byte(nil), key...) }
}

// WithLogger sets the logger of the service's log lines. Default:
// [slog.Default], as it is when a line is logged; nil selects the default.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithTracerProvider sets the OpenTelemetry tracer provider of the
// service's spans. Default: the global provider, [otel.GetTracerProvider];
// nil selects the default.
//
// [otel.GetTracerProvider]: https://pkg.go.dev/go.opentelemetry.io/otel#GetTracerProvider
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// WithFinisher sets the finisher FinishKey runs abandoned calls through:
// give it the Finisher the server runs, with every finishable method
// registered (interceptor.FinisherRegistrar), over the same store as the
// service. Default: none, and FinishKey answers UNIMPLEMENTED, after
// authorizing the call; nil selects the default.
func WithFinisher(f *idem.Finisher) Option {
	return func(o *options) { o.finisher = f }
}
