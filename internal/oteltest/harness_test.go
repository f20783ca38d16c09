package oteltest

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// telemetry is an OpenTelemetry SDK whose metrics and spans a test reads
// back: a manual reader and an in-memory span recorder.
type telemetry struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	tel := &telemetry{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	t.Cleanup(func() {
		_ = tel.mp.Shutdown(context.Background())
		_ = tel.tp.Shutdown(context.Background())
	})
	return tel
}

// metrics is what the reader has collected: each metric's data points,
// keyed by their attributes.
type metrics map[string]map[string]point

// point is one data point: a counter's value, or a histogram's count and
// sum.
type point struct {
	value int64
	count uint64
	sum   float64
	attrs attribute.Set
}

func (tel *telemetry) collect(t *testing.T) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			pts := map[string]point{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					pts[attrString(dp.Attributes)] = point{value: dp.Value, attrs: dp.Attributes}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					pts[attrString(dp.Attributes)] = point{count: dp.Count, sum: dp.Sum, attrs: dp.Attributes}
				}
			default:
				t.Fatalf("metric %s has data of type %T", m.Name, m.Data)
			}
			out[m.Name] = pts
		}
	}
	return out
}

// attrString writes a set of attributes as "k=v,k=v", sorted by key.
func attrString(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, fmt.Sprintf("%s=%s", kv.Key, kv.Value.Emit()))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// attrs writes key-value pairs as attrString does.
func attrs(kv ...string) string {
	var parts []string
	for i := 0; i+1 < len(kv); i += 2 {
		parts = append(parts, kv[i]+"="+kv[i+1])
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// diff returns what changed between two collections: for each metric, the
// data points whose value or count grew, by how much.
func diff(before, after metrics) map[string]map[string]point {
	out := map[string]map[string]point{}
	for name, pts := range after {
		for k, p := range pts {
			b := before[name][k]
			d := point{value: p.value - b.value, count: p.count - b.count, sum: p.sum - b.sum, attrs: p.attrs}
			if d.value == 0 && d.count == 0 {
				continue
			}
			if out[name] == nil {
				out[name] = map[string]point{}
			}
			out[name][k] = d
		}
	}
	return out
}

// hookRecorder keeps the reports a report hook saw.
type hookRecorder struct {
	mu  sync.Mutex
	got []idem.Report
}

func (r *hookRecorder) hook(_ context.Context, o idem.Report) {
	r.mu.Lock()
	r.got = append(r.got, o)
	r.mu.Unlock()
}

func (r *hookRecorder) take() []idem.Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

// wantNoSecrets fails the test if an attribute of a metric or a span
// carries one of secrets, such as a key or a tenant.
func wantNoSecrets(t *testing.T, tel *telemetry, secrets ...string) {
	t.Helper()
	check := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			for _, s := range secrets {
				if strings.Contains(kv.Value.Emit(), s) || strings.Contains(string(kv.Key), s) {
					t.Errorf("%s has attribute %s=%s, which carries %q", where, kv.Key, kv.Value.Emit(), s)
				}
			}
		}
	}
	for name, pts := range tel.collect(t) {
		for _, p := range pts {
			check("metric "+name, p.attrs.ToSlice())
		}
	}
	for _, s := range tel.spans.Ended() {
		check("span "+s.Name(), s.Attributes())
		for _, e := range s.Events() {
			check("event "+e.Name+" of span "+s.Name(), e.Attributes)
		}
	}
}
