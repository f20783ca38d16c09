package interceptor

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// clientOptions are the options of [UnaryClientInterceptor].
type clientOptions struct {
	keyed         Matcher
	meterProvider metric.MeterProvider // nil: otel.GetMeterProvider()
}

func evaluateClientOptions(opts []ClientOption) *clientOptions {
	o := &clientOptions{}
	for _, opt := range opts {
		opt.applyClient(o)
	}
	return o
}

// Matcher selects RPCs by full method name ("/pkg.Service/Method").
type Matcher interface {
	Match(ctx context.Context, fullMethod string) bool
}

// MatchFunc adapts a function to a [Matcher].
type MatchFunc func(ctx context.Context, fullMethod string) bool

// Match calls f(ctx, fullMethod).
func (f MatchFunc) Match(ctx context.Context, fullMethod string) bool { return f(ctx, fullMethod) }

// WithKeyedMethods makes [UnaryClientInterceptor] attach keys to the calls m
// matches as well as to methods marked (idem.v1.method).key_required; use it
// for methods whose .proto files carry no idem options, or that are not in
// the client's protobuf registry. Methods marked IDEMPOTENT or
// NO_SIDE_EFFECTS never get a key. Default: only methods marked
// key_required.
func WithKeyedMethods(m Matcher) ClientOption {
	return clientOption(func(o *clientOptions) { o.keyed = m })
}
