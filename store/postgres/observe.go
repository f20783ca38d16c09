package postgres

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationScope names the meter and the tracer of the sweeper and
// the inbox.
const instrumentationScope = "github.com/idemkit/idem/store/postgres"

// observeOptions are the logger and the OpenTelemetry providers of a
// Sweeper or an Inbox.
type observeOptions struct {
	logger         *slog.Logger         // nil: slog.Default()
	meterProvider  metric.MeterProvider // nil: otel.GetMeterProvider()
	tracerProvider trace.TracerProvider // nil: otel.GetTracerProvider()
}

func (o observeOptions) log() *slog.Logger {
	if o.logger == nil {
		return slog.Default()
	}
	return o.logger
}

func (o observeOptions) meter() metric.Meter {
	mp := o.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(instrumentationScope)
}

func (o observeOptions) tracer() trace.Tracer {
	tp := o.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(instrumentationScope)
}

// WithLogger sets where [Sweeper.Run] logs: a failed pass at level ERROR,
// a pass that deleted rows at level DEBUG. Default: [slog.Default], as it
// is when a line is logged; nil selects the default. The store and the
// inbox do not log.
func WithLogger(l *slog.Logger) SweeperOption {
	return sweeperOptionFunc(func(o *sweeperOptions) { o.observe.logger = l })
}

// An ObserveOption configures both a [Sweeper] and an [Inbox]: the same
// value may be passed to [NewSweeper] and to [NewInbox].
type ObserveOption interface {
	SweeperOption
	InboxOption
}

// observeOption sets the observeOptions of a Sweeper or an Inbox.
type observeOption func(*observeOptions)

func (f observeOption) applySweeper(o *sweeperOptions) { f(&o.observe) }
func (f observeOption) applyInbox(o *inboxOptions)     { f(&o.observe) }

// WithMeterProvider sets the OpenTelemetry meter provider of the metrics
// of a [Sweeper] or an [Inbox]. The sweeper's are idem.sweeper.deleted (a
// counter of deleted rows, by attribute idem.table) and
// idem.sweeper.pass.duration (a histogram of the passes' durations, in
// seconds); the inbox's is idem.inbox.messages, a counter of the messages
// [Inbox.ProcessOnce] processed or found processed before, by attributes
// idem.consumer and idem.outcome (processed, duplicate). Default: the
// global provider, [otel.GetMeterProvider]; nil selects the default.
func WithMeterProvider(mp metric.MeterProvider) ObserveOption {
	return observeOption(func(o *observeOptions) { o.meterProvider = mp })
}

// WithTracerProvider sets the OpenTelemetry tracer provider of the spans
// of a [Sweeper] or an [Inbox]: idem.sweeper.pass, which each
// [Sweeper.Sweep] records, and idem.inbox.process, which each
// [Inbox.ProcessOnce] of a valid message id records, with its consumer and
// outcome. Default: the global provider, [otel.GetTracerProvider]; nil
// selects the default.
func WithTracerProvider(tp trace.TracerProvider) ObserveOption {
	return observeOption(func(o *observeOptions) { o.tracerProvider = tp })
}

// The attributes of the sweeper's and the inbox's metrics and spans.
const (
	attrTable    = "idem.table"
	attrConsumer = "idem.consumer"
	attrOutcome  = "idem.outcome"
	attrDeleted  = "idem.deleted"
)

// passBuckets are the histogram boundaries, in seconds, of sweeper passes.
var passBuckets = []float64{0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300}

// sweeperObserver holds the instruments and the tracer of a Sweeper.
type sweeperObserver struct {
	tracer  trace.Tracer
	deletes metric.Int64Counter
	pass    metric.Float64Histogram
	tables  map[string][]metric.AddOption
}

func newSweeperObserver(o observeOptions) *sweeperObserver {
	m := o.meter()
	deletes, err1 := m.Int64Counter("idem.sweeper.deleted", metric.WithUnit("{row}"),
		metric.WithDescription("Expired rows the sweeper deleted, by table."))
	pass, err2 := m.Float64Histogram("idem.sweeper.pass.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a sweeper pass over the tables took."),
		metric.WithExplicitBucketBoundaries(passBuckets...))
	if err := errors.Join(err1, err2); err != nil {
		otel.Handle(err)
	}
	obs := &sweeperObserver{tracer: o.tracer(), deletes: deletes, pass: pass, tables: map[string][]metric.AddOption{}}
	for _, t := range sweepTables {
		obs.tables[t.name] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String(attrTable, t.name)))}
	}
	return obs
}

// deleted counts n rows deleted from table.
func (o *sweeperObserver) deleted(ctx context.Context, table string, n int64) {
	if n > 0 {
		o.deletes.Add(ctx, n, o.tables[table]...)
	}
}

// sweepPass times one pass of a Sweeper.
type sweepPass struct {
	obs   *sweeperObserver
	ctx   context.Context
	span  trace.Span
	start time.Time
}

func (o *sweeperObserver) startPass(ctx context.Context) (context.Context, sweepPass) {
	p := sweepPass{obs: o, start: time.Now()}
	p.ctx, p.span = o.tracer.Start(ctx, "idem.sweeper.pass")
	return p.ctx, p
}

// end records the pass, which deleted n rows and ended with err.
func (p sweepPass) end(n int64, err error) {
	p.obs.pass.Record(p.ctx, time.Since(p.start).Seconds())
	p.span.SetAttributes(attribute.Int64(attrDeleted, n))
	if err != nil {
		p.span.SetStatus(otelcodes.Error, err.Error())
	}
	p.span.End()
}

// The outcomes of idem.inbox.messages.
const (
	inboxProcessed = "processed"
	inboxDuplicate = "duplicate"
)

// inboxObserver holds the instruments and the tracer of an Inbox.
type inboxObserver struct {
	tracer               trace.Tracer
	messages             metric.Int64Counter
	consumer             attribute.KeyValue
	processed, duplicate []metric.AddOption
}

func newInboxObserver(o observeOptions, consumer string) *inboxObserver {
	messages, err := o.meter().Int64Counter("idem.inbox.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages an inbox processed, or found processed before (duplicate), by consumer."))
	if err != nil {
		otel.Handle(err)
	}
	c := attribute.String(attrConsumer, consumer)
	attrs := func(outcome string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(c, attribute.String(attrOutcome, outcome)))}
	}
	return &inboxObserver{
		tracer:    o.tracer(),
		messages:  messages,
		consumer:  c,
		processed: attrs(inboxProcessed),
		duplicate: attrs(inboxDuplicate),
	}
}

func (o *inboxObserver) start(ctx context.Context) (context.Context, trace.Span) {
	return o.tracer.Start(ctx, "idem.inbox.process", trace.WithAttributes(o.consumer))
}

// end counts a message that ProcessOnce found duplicate, or processed
// without err, and ends its span.
func (o *inboxObserver) end(ctx context.Context, span trace.Span, duplicate bool, err error) {
	switch {
	case err != nil:
		span.SetStatus(otelcodes.Error, err.Error())
	case duplicate:
		o.messages.Add(ctx, 1, o.duplicate...)
		span.SetAttributes(attribute.String(attrOutcome, inboxDuplicate))
	default:
		o.messages.Add(ctx, 1, o.processed...)
		span.SetAttributes(attribute.String(attrOutcome, inboxProcessed))
	}
	span.End()
}
