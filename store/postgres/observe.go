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

// instrumentationScope names the meter and the tracer of the sweeper.
const instrumentationScope = "github.com/idemkit/idem/store/postgres"

// observeOptions are the logger and the OpenTelemetry providers of a
// Sweeper.
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
// is when a line is logged; nil selects the default. The store does not
// log.
func WithLogger(l *slog.Logger) SweeperOption {
	return func(o *sweeperOptions) { o.observe.logger = l }
}

// WithMeterProvider sets the OpenTelemetry meter provider of the metrics
// of a [Sweeper]: idem.sweeper.deleted (a counter of deleted rows, by
// attribute idem.table) and idem.sweeper.pass.duration (a histogram of
// the passes' durations, in seconds). Default: the global provider,
// [otel.GetMeterProvider]; nil selects the default.
func WithMeterProvider(mp metric.MeterProvider) SweeperOption {
	return func(o *sweeperOptions) { o.observe.meterProvider = mp }
}

// WithTracerProvider sets the OpenTelemetry tracer provider of the spans
// of a [Sweeper]: idem.sweeper.pass, which each [Sweeper.Sweep] records.
// Default: the global provider, [otel.GetTracerProvider]; nil selects the
// default.
func WithTracerProvider(tp trace.TracerProvider) SweeperOption {
	return func(o *sweeperOptions) { o.observe.tracerProvider = tp }
}

// The attributes of the sweeper's metrics and spans.
const (
	attrTable   = "idem.table"
	attrDeleted = "idem.deleted"
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
