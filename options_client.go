package idem

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// clientOptions are the options of a client's outgoing keys.
type clientOptions struct {
	keyed         func(context.Context, string) bool
	meterProvider metric.MeterProvider // nil: otel.GetMeterProvider()
}

func evaluateClientOptions(opts []ClientOption) *clientOptions {
	o := &clientOptions{}
	for _, opt := range opts {
		opt.applyClient(o)
	}
	return o
}

// A ClientOption configures the keys a client attaches to its calls
// (interceptor.UnaryClientInterceptor, idemconnect.NewClientInterceptor).
type ClientOption interface {
	applyClient(*clientOptions)
}

type clientOptionFunc func(*clientOptions)

func (f clientOptionFunc) applyClient(o *clientOptions) { f(o) }

// WithKeyedMethods makes the client attach keys to the calls keyed selects
// (by full method name, "/pkg.Service/Method") as well as to methods marked
// (idem.v1.method).key_required; use it for methods whose .proto files
// carry no idem options, or that are not in the client's protobuf
// registry. Methods marked IDEMPOTENT or NO_SIDE_EFFECTS never get a key.
// Default: only methods marked key_required.
func WithKeyedMethods(keyed func(ctx context.Context, fullMethod string) bool) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.keyed = keyed })
}
