package idem

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/store"
)

// instrumentationScope names the meter and the tracer of the engine and of
// the client adapters' keys.
const instrumentationScope = "github.com/idemkit/idem"

// The attributes idem sets on metrics, spans and log lines. None of them
// carries the key, the tenant or the fingerprint.
const (
	attrMethod     = "rpc.method"
	attrMode       = "idem.mode"
	attrResult     = "idem.result"
	attrReplayed   = "idem.replayed"
	attrKeySource  = "idem.key.source"
	attrClaimWait  = "idem.claim.wait"
	attrOptimistic = "idem.optimistic"
)

// durationBuckets are the histogram boundaries, in seconds, of the claim and
// record durations: from half a millisecond (a claim on a warm connection)
// to ten seconds (a long wait on a busy key).
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// WithMeterProvider sets the OpenTelemetry meter provider of idem's
// metrics, the engine's and the client adapters' (see the package documentation, "Metrics, traces
// and logs"). Default: the global provider, [otel.GetMeterProvider], which
// forwards to the provider a program sets later with otel.SetMeterProvider;
// nil selects the default.
func WithMeterProvider(mp metric.MeterProvider) ObserveOption {
	return observeOption{
		engine: func(o *options) { o.meterProvider = mp },
		client: func(o *clientOptions) { o.meterProvider = mp },
	}
}

// observeOption is an option of both an Engine and a client.
type observeOption struct {
	engine optionFunc
	client clientOptionFunc
}

func (o observeOption) apply(e *options)             { o.engine(e) }
func (o observeOption) applyClient(c *clientOptions) { o.client(c) }

// WithTracerProvider sets the OpenTelemetry tracer provider of the spans
// the engine starts around claiming a key (idem.claim) and
// recording an outcome (idem.record), as children of the call's own span
// (the one in the context, started by a stats handler such as otelgrpc's)
// when that span is recorded. The attributes and events idem puts on the
// call's span need no provider. Default: the global
// provider, [otel.GetTracerProvider]; nil selects the default.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(o *options) { o.tracerProvider = tp })
}

// observer holds the instruments and the tracer of an [Engine].
type observer struct {
	tracer     trace.Tracer
	requests   metric.Int64Counter
	claim      metric.Float64Histogram
	record     metric.Float64Histogram
	takeovers  metric.Int64Counter
	extensions metric.Int64Counter

	// Attribute sets, built once per combination: calls of one method
	// share them instead of allocating their own.
	resultAttrs sync.Map // resultAttrKey → []metric.AddOption
	methodAttrs sync.Map // methodAttrKey → *methodAttrs
}

type resultAttrKey struct {
	method string
	mode   Mode
	result Result
}

type methodAttrKey struct {
	method string
	mode   Mode
}

// methodAttrs are the measurement options of one method in one mode.
type methodAttrs struct {
	add    []metric.AddOption
	record []metric.RecordOption
	span   []trace.SpanStartOption
}

// newObserver returns the observer of an Engine configured by o. A meter
// whose instruments cannot be created hands the error to otel.Handle and
// yields instruments that record nothing, as OpenTelemetry prescribes.
func newObserver(o *options) *observer {
	mp := o.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	tp := o.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(instrumentationScope)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		errs = append(errs, err)
		return h
	}
	obs := &observer{
		tracer: tp.Tracer(instrumentationScope),
		requests: counter("idem.server.requests", "{request}",
			"Calls idem ended, by method, mode and result."),
		claim: histogram("idem.claim.duration",
			"How long claiming an idempotency key took, waits on a busy key included."),
		record: histogram("idem.record.duration",
			"How long recording a call's outcome took."),
		takeovers: counter("idem.lease.takeovers", "{takeover}",
			"Leased claims that took a key over from a request whose lease had run out."),
		extensions: counter("idem.lease.extensions", "{extension}",
			"Extensions of running leases by their heartbeat."),
	}
	if err := errors.Join(errs...); err != nil {
		otel.Handle(err)
	}
	return obs
}

// methodName is method as the attribute rpc.method holds it:
// "pkg.Service/Method", without the leading slash of gRPC's full method name.
func methodName(method string) string {
	return strings.TrimPrefix(method, "/")
}

func (o *observer) attrsOf(method string, mode Mode) *methodAttrs {
	k := methodAttrKey{method, mode}
	if a, ok := o.methodAttrs.Load(k); ok {
		return a.(*methodAttrs)
	}
	kv := []attribute.KeyValue{
		attribute.String(attrMethod, methodName(method)),
		attribute.String(attrMode, string(mode)),
	}
	set := attribute.NewSet(kv...)
	a, _ := o.methodAttrs.LoadOrStore(k, &methodAttrs{
		add:    []metric.AddOption{metric.WithAttributeSet(set)},
		record: []metric.RecordOption{metric.WithAttributeSet(set)},
		span:   []trace.SpanStartOption{trace.WithAttributes(kv...)},
	})
	return a.(*methodAttrs)
}

func (o *observer) resultAttrsOf(c *callState) []metric.AddOption {
	k := resultAttrKey{c.method, c.mode, c.result}
	if a, ok := o.resultAttrs.Load(k); ok {
		return a.([]metric.AddOption)
	}
	set := attribute.NewSet(
		attribute.String(attrMethod, methodName(c.method)),
		attribute.String(attrMode, string(c.mode)),
		attribute.String(attrResult, string(c.result)),
	)
	a, _ := o.resultAttrs.LoadOrStore(k, []metric.AddOption{metric.WithAttributeSet(set)})
	return a.([]metric.AddOption)
}

// observe counts the ended call c, records its durations and sets its
// result on the call's span.
func (o *observer) observe(ctx context.Context, c *callState) {
	o.requests.Add(ctx, 1, o.resultAttrsOf(c)...)
	a := o.attrsOf(c.method, c.mode)
	if c.claim > 0 {
		o.claim.Record(ctx, c.claim.Seconds(), a.record...)
	}
	if c.record > 0 {
		o.record.Record(ctx, c.record.Seconds(), a.record...)
	}
	if c.tookOver {
		o.takeovers.Add(ctx, 1, a.add...)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(
			attribute.String(attrResult, string(c.result)),
			attribute.Bool(attrReplayed, c.replayed),
			attribute.String(attrMode, string(c.mode)),
		)
		if c.mode == ModeAuto {
			span.SetAttributes(attribute.Bool(attrOptimistic, c.readNothing))
		}
		if c.tookOver {
			span.AddEvent("idem.lease.takeover")
		}
		if c.result == ResultInUse {
			span.AddEvent("idem.key_in_use", trace.WithAttributes(attribute.Float64(attrClaimWait, c.claim.Seconds())))
		}
	}
}

// extended counts an extension of a lease of method by its heartbeat.
func (o *observer) extended(ctx context.Context, method string) {
	o.extensions.Add(ctx, 1, o.attrsOf(method, ModeLeased).add...)
}

// spanName is the name of a child span of a call.
type spanName string

const (
	spanClaim  spanName = "idem.claim"
	spanRecord spanName = "idem.record"
)

// timer times one store call of a call, in a child span of the call's.
type timer struct {
	span  trace.Span // nil: the call is not traced
	start time.Time
}

// start starts timing a store call of c named name and returns the context
// for the store call to run with: when the call's span is recorded, with a
// child span of it. A call that is not traced gets no span of idem's
// either, which would only be a root without its call.
func (o *observer) start(ctx context.Context, c *callState, name spanName) (context.Context, timer) {
	t := timer{start: time.Now()}
	if trace.SpanFromContext(ctx).IsRecording() {
		ctx, t.span = o.tracer.Start(ctx, string(name), o.attrsOf(c.method, c.mode).span...)
	}
	return ctx, t
}

// end ends the store call timed by t, which returned err, and returns how
// long it took. A key another request holds is no failure of the store.
func (t timer) end(err error) time.Duration {
	d := time.Since(t.start)
	if t.span == nil {
		return d
	}
	if err != nil && !errors.Is(err, store.ErrInUse) {
		t.span.SetStatus(otelcodes.Error, err.Error())
	}
	t.span.End()
	return d
}
