package inbox

import (
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// defaultRetention is how long an [Inbox] keeps a processed message's id by
// default.
const defaultRetention = 7 * 24 * time.Hour

type options struct {
	retention      time.Duration
	meterProvider  metric.MeterProvider // nil: otel.GetMeterProvider()
	tracerProvider trace.TracerProvider // nil: otel.GetTracerProvider()
}

var defaultOptions = options{retention: defaultRetention}

// Option configures an [Inbox].
type Option func(*options)

// WithRetention sets how long the id of a processed message is kept
// (processed_messages.expires_at = processing time + d). It must exceed
// the longest time after which the broker can still deliver the message
// again: its redelivery window (for JetStream, the stream's max age or
// ack wait × max deliveries, whichever ends first) and the time a producer
// may retry a publish. A postgres.Sweeper deletes rows past expires_at;
// until it does, the row still marks the message processed. Default: 7
// days. Non-positive values select the default.
func WithRetention(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			d = defaultRetention
		}
		o.retention = d
	}
}

// WithMeterProvider sets the OpenTelemetry meter provider of the inbox's
// metric, idem.inbox.messages: a counter of the messages
// [Inbox.ProcessOnce] processed or found processed before, by attributes
// idem.consumer and idem.result (processed, duplicate). Default: the
// global provider, [otel.GetMeterProvider]; nil selects the default.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.meterProvider = mp }
}

// WithTracerProvider sets the OpenTelemetry tracer provider of the
// inbox's spans: idem.inbox.process, which each [Inbox.ProcessOnce] of a
// valid message id records, with its consumer and outcome. Default: the
// global provider, [otel.GetTracerProvider]; nil selects the default.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}
