package inbox

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationScope names the meter and the tracer of the inbox.
const instrumentationScope = "github.com/idemkit/idem/store/postgres/inbox"

// The attributes of the inbox's metric and spans.
const (
	attrConsumer = "idem.consumer"
	attrOutcome  = "idem.result"
)

// The outcomes of idem.inbox.messages.
const (
	outcomeProcessed = "processed"
	outcomeDuplicate = "duplicate"
)

// observer holds the instruments and the tracer of an Inbox.
type observer struct {
	tracer               trace.Tracer
	messages             metric.Int64Counter
	consumer             attribute.KeyValue
	processed, duplicate []metric.AddOption
}

func newObserver(o options, consumer string) *observer {
	mp, tp := o.meterProvider, o.tracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	messages, err := mp.Meter(instrumentationScope).Int64Counter("idem.inbox.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages an inbox processed, or found processed before (duplicate), by consumer."))
	if err != nil {
		otel.Handle(err)
	}
	c := attribute.String(attrConsumer, consumer)
	attrs := func(outcome string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(c, attribute.String(attrOutcome, outcome)))}
	}
	return &observer{
		tracer:    tp.Tracer(instrumentationScope),
		messages:  messages,
		consumer:  c,
		processed: attrs(outcomeProcessed),
		duplicate: attrs(outcomeDuplicate),
	}
}

func (o *observer) start(ctx context.Context) (context.Context, trace.Span) {
	return o.tracer.Start(ctx, "idem.inbox.process", trace.WithAttributes(o.consumer))
}

// end counts a message that ProcessOnce found duplicate, or processed
// without err, and ends its span.
func (o *observer) end(ctx context.Context, span trace.Span, duplicate bool, err error) {
	switch {
	case err != nil:
		span.SetStatus(otelcodes.Error, err.Error())
	case duplicate:
		o.messages.Add(ctx, 1, o.duplicate...)
		span.SetAttributes(attribute.String(attrOutcome, outcomeDuplicate))
	default:
		o.messages.Add(ctx, 1, o.processed...)
		span.SetAttributes(attribute.String(attrOutcome, outcomeProcessed))
	}
	span.End()
}
