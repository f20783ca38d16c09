package idem

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// keySource is where the key of an outgoing call comes from, the value of
// the attribute idem.key.source of idem.client.keys.
type keySource string

const (
	// sourceGenerated: a new UUID, for a call made outside a keyed handler.
	sourceGenerated keySource = "generated"
	// sourceDerived: a child key of the request being handled.
	sourceDerived keySource = "derived"
	// sourceCaller: the caller's own key, set with ContextWithKey or put in
	// the outgoing metadata.
	sourceCaller keySource = "caller"
)

// clientObserver holds the instruments of a client adapter's keys.
type clientObserver struct {
	keys  metric.Int64Counter
	attrs sync.Map // clientAttrKey → []metric.AddOption
}

type clientAttrKey struct {
	method string
	source keySource
}

func newClientObserver(o *clientOptions) *clientObserver {
	mp := o.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	keys, err := mp.Meter(instrumentationScope).Int64Counter("idem.client.keys",
		metric.WithUnit("{call}"),
		metric.WithDescription("Calls an idem client adapter sent with an idempotency key, by method and where the key came from."))
	if err != nil {
		otel.Handle(err)
	}
	return &clientObserver{keys: keys}
}

// keyed counts a call of method that carries a key from src; a call
// without a key (src "") is not counted.
func (o *clientObserver) keyed(ctx context.Context, method string, src keySource) {
	if src == "" {
		return
	}
	k := clientAttrKey{method, src}
	a, ok := o.attrs.Load(k)
	if !ok {
		a, _ = o.attrs.LoadOrStore(k, []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String(attrMethod, methodName(method)),
			attribute.String(attrKeySource, string(src)),
		))})
	}
	o.keys.Add(ctx, 1, a.([]metric.AddOption)...)
}
