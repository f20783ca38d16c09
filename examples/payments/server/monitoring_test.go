package main

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/inbox"
)

// monitoringDir holds the Grafana dashboard and the Prometheus alerting
// rules (and their promtool tests) that TestMonitoringNames checks.
const monitoringDir = "../../../docs/monitoring"

// producedElsewhere are the metrics of idem's code that nothing in
// TestMonitoringNames produces, with the reason. The test checks them
// against the instruments idem creates, named as the example's exporter
// names them, instead of against a scrape.
var producedElsewhere = map[string]string{
	"idem_lease_takeovers_total": "produced only in leased mode, when a claim takes over a key whose lease ran out " +
		"(examples/checkout, which serves no metrics); PaymentService's methods are atomic",
	"idem_lease_extensions_total": "produced only in leased mode, by the heartbeat of a handler that outlives a third of its lease",
}

// results are the values of idem_result: the engine's, on
// idem_server_requests_total, and the inbox's, on idem_inbox_messages_total.
var results = []idem.Result{
	idem.ResultExecuted, idem.ResultReplayed, idem.ResultInUse, idem.ResultReused,
	idem.ResultInvalidKey, idem.ResultMissingKey, idem.ResultPassthrough, idem.ResultNotCached,
	idem.ResultRebuilt, idem.ResultRerun, idem.ResultLeaseLost, idem.ResultStoreError,
	idem.ResultTransient, idem.ResultNotFinished, idem.ResultUnreadable,
	"processed", "duplicate",
}

// TestMonitoringNames keeps docs/monitoring in step with the code: it runs
// the server with its metrics endpoint, makes calls that execute, replay
// and reuse a key, lets its sweeper delete an expired row, runs idem's
// client interceptor and an inbox on a meter provider the example's
// exporter serves, scrapes both, and fails if the dashboard, the alerting
// rules or their tests name an idem_ or rpc_ metric or label that is
// neither exposed nor listed in producedElsewhere, or an idem_result that
// neither the engine nor the inbox reports.
func TestMonitoringNames(t *testing.T) {
	ctx, cancelCalls := context.WithTimeout(context.Background(), time.Minute)
	defer cancelCalls()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}

	// What the server does not run, idem's client interceptor and an
	// inbox, runs on a meter provider of the example's serveMetrics, so
	// that the exporter names their metrics as it names the server's.
	sideLis := listen(t)
	sideMP, stopSide, err := serveMetrics(sideLis)
	if err != nil {
		t.Fatal(err)
	}
	defer stopSide()
	in := inbox.New(pool, "monitoring-test", inbox.WithMeterProvider(sideMP))
	for _, want := range []bool{false, true} { // processed, then duplicate
		if dup, err := in.ProcessOnce(ctx, "m-1", func(pgx.Tx) error { return nil }); err != nil || dup != want {
			t.Fatalf("ProcessOnce: duplicate %v, %v; want duplicate %v", dup, err, want)
		}
	}
	// The message's id expires now, for the server's sweeper to delete at
	// its first pass: idem_sweeper_deleted_total counts only deletions.
	if _, err := pool.Exec(ctx, `UPDATE processed_messages SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}

	lis, metricsLis := listen(t), listen(t)
	serve(t, lis, nil, metricsLis, dsn)

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor(idem.WithMeterProvider(sideMP))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := paymentsv1.NewPaymentServiceClient(conn)
	keyed := metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, "k", "x-tenant-id", "acme")
	req := &paymentsv1.CreatePaymentRequest{CustomerId: "c", AmountCents: 1, Currency: "EUR"}
	for _, call := range []string{"executed", "replayed"} {
		if _, err := client.CreatePayment(keyed, req, grpc.WaitForReady(true)); err != nil {
			t.Fatalf("call to be %s: %v", call, err)
		}
	}
	other := &paymentsv1.CreatePaymentRequest{CustomerId: "c", AmountCents: 2, Currency: "EUR"}
	if _, err := client.CreatePayment(keyed, other); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("the key with another request: %v, want FailedPrecondition", err)
	}

	// The sweeper's first pass runs as the server starts; wait until the
	// endpoint shows what it deleted.
	url := "http://" + metricsLis.Addr().String() + "/metrics"
	var served string
	for deadline := time.Now().Add(30 * time.Second); ; {
		served = get(t, url)
		if strings.Contains(served, "idem_sweeper_deleted_total{") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sweeper deleted nothing in 30 s (no idem_sweeper_deleted_total); metrics:\n%s", served)
		}
		time.Sleep(20 * time.Millisecond)
	}
	exposed := scrape(served)
	exposed.add(scrape(get(t, "http://"+sideLis.Addr().String()+"/metrics")))
	for result := range exposed.values["idem_result"] {
		if !slices.Contains(results, idem.Result(result)) {
			t.Errorf("the endpoints expose idem_result %q, which this test does not know; add it to results", result)
		}
	}

	// The metrics nothing here produces must be instruments of idem's
	// code, and not exposed already (or the list is stale).
	code := instrumentNames(t, pool)
	for name, why := range producedElsewhere {
		switch {
		case !code[name]:
			t.Errorf("producedElsewhere lists %s (%s), but idem creates no instrument of that name; idem's instruments, as Prometheus names them: %v",
				name, why, slices.Sorted(maps.Keys(code)))
		case exposed.names[name]:
			t.Errorf("producedElsewhere lists %s, but the endpoints expose it; remove it from the list", name)
		}
	}
	for name := range code {
		if !exposed.names[name] && producedElsewhere[name] == "" {
			t.Errorf("idem creates %s, which the endpoints do not expose and producedElsewhere does not list", name)
		}
	}

	for _, file := range []string{"dashboard.json", "alerts.yml", "alerts_test.yml"} {
		text := read(t, file)
		named := map[string]bool{}
		for _, name := range nameRE.FindAllString(text, -1) {
			if named[name] {
				continue
			}
			named[name] = true
			if !exposed.names[name] && !exposed.labels[name] && producedElsewhere[name] == "" {
				t.Errorf("%s names %s, which is no metric or label the example exposes, nor in producedElsewhere", file, name)
			}
		}
		for _, m := range matcherRE.FindAllStringSubmatch(text, -1) {
			for _, v := range strings.Split(m[1], "|") {
				if !slices.Contains(results, idem.Result(v)) {
					t.Errorf("%s matches idem_result %q, which neither idem nor its inbox reports (results: %v)", file, v, results)
				}
			}
		}
	}
	checkDashboard(t, read(t, "dashboard.json"))
}

// nameRE matches the names of idem's metrics and labels and of the rpc_
// labels; matcherRE a matcher of idem_result (the engine's results and the
// inbox's) in PromQL, escaped in JSON or not.
var (
	nameRE    = regexp.MustCompile(`\b(?:idem|rpc)_[a-z0-9_]+`)
	matcherRE = regexp.MustCompile(`idem_result\s*(?:=~|!~|!=|=)\s*\\?"([^"\\]*)`)
)

// exposition is what a scrape exposes: the names of samples and metric
// families, the label names, and the values of idem_result, by label.
type exposition struct {
	names, labels map[string]bool
	values        map[string]map[string]bool
}

func (e exposition) add(o exposition) {
	for _, m := range []struct{ to, from map[string]bool }{{e.names, o.names}, {e.labels, o.labels}} {
		for k := range m.from {
			m.to[k] = true
		}
	}
	for label, vs := range o.values {
		for v := range vs {
			e.value(label, v)
		}
	}
}

// value records v as a value of label.
func (e exposition) value(label, v string) {
	if e.values[label] == nil {
		e.values[label] = map[string]bool{}
	}
	e.values[label][v] = true
}

var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// scrape reads the Prometheus text format text.
func scrape(text string) exposition {
	e := exposition{names: map[string]bool{}, labels: map[string]bool{}, values: map[string]map[string]bool{}}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if family, ok := strings.CutPrefix(line, "# TYPE "); ok {
			e.names[strings.Fields(family)[0]] = true
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		e.names[name] = true
		set, _, _ := strings.Cut(rest, "}")
		for _, l := range labelRE.FindAllStringSubmatch(set, -1) {
			e.labels[l[1]] = true
			if l[1] == "idem_result" {
				e.value(l[1], l[2])
			}
		}
	}
	return e
}

// instrumentNames returns the Prometheus names (each histogram's series
// and family) of the instruments idem's engine, client interceptor,
// sweeper and inbox create, as the example's exporter names them.
func instrumentNames(t *testing.T, pool *pgxpool.Pool) map[string]bool {
	t.Helper()
	mp := &instruments{}
	if _, err := idem.New(memory.New(), idem.WithMeterProvider(mp)); err != nil {
		t.Fatal(err)
	}
	interceptor.UnaryClientInterceptor(idem.WithMeterProvider(mp))
	postgres.NewSweeper(pool, postgres.WithMeterProvider(mp))
	inbox.New(pool, "monitoring-test", inbox.WithMeterProvider(mp))

	namer := otlptranslator.NewMetricNamer("", otlptranslator.UnderscoreEscapingWithSuffixes)
	names := map[string]bool{}
	mp.mu.Lock()
	defer mp.mu.Unlock()
	for _, m := range mp.created {
		name, err := namer.Build(m)
		if err != nil {
			t.Fatalf("naming %s: %v", m.Name, err)
		}
		names[name] = true
		if m.Type == otlptranslator.MetricTypeHistogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[name+s] = true
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("idem created no instrument")
	}
	return names
}

// instruments is a meter provider that keeps the name, unit and kind of
// the counters and histograms created with it, and records nothing.
type instruments struct {
	noop.MeterProvider
	mu      sync.Mutex
	created []otlptranslator.Metric
}

func (p *instruments) Meter(string, ...metric.MeterOption) metric.Meter {
	return instrumentMeter{p: p}
}

func (p *instruments) add(name, unit string, kind otlptranslator.MetricType) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.created = append(p.created, otlptranslator.Metric{Name: name, Unit: unit, Type: kind})
}

type instrumentMeter struct {
	noop.Meter
	p *instruments
}

func (m instrumentMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	m.p.add(name, metric.NewInt64CounterConfig(opts...).Unit(), otlptranslator.MetricTypeMonotonicCounter)
	return m.Meter.Int64Counter(name, opts...)
}

func (m instrumentMeter) Float64Counter(name string, opts ...metric.Float64CounterOption) (metric.Float64Counter, error) {
	m.p.add(name, metric.NewFloat64CounterConfig(opts...).Unit(), otlptranslator.MetricTypeMonotonicCounter)
	return m.Meter.Float64Counter(name, opts...)
}

func (m instrumentMeter) Int64Histogram(name string, opts ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	m.p.add(name, metric.NewInt64HistogramConfig(opts...).Unit(), otlptranslator.MetricTypeHistogram)
	return m.Meter.Int64Histogram(name, opts...)
}

func (m instrumentMeter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	m.p.add(name, metric.NewFloat64HistogramConfig(opts...).Unit(), otlptranslator.MetricTypeHistogram)
	return m.Meter.Float64Histogram(name, opts...)
}

// checkDashboard checks that the dashboard is JSON that Grafana imports
// with any Prometheus data source: a datasource variable, used by every
// panel and query.
func checkDashboard(t *testing.T, text string) {
	t.Helper()
	type datasource struct{ Type, UID string }
	type variable struct {
		Type, Name string
		Query      json.RawMessage // a string, or a query variable's object
	}
	var d struct {
		Templating struct {
			List []variable
		}
		Panels []struct {
			Title      string
			Type       string
			Datasource *datasource
			Targets    []struct {
				Datasource *datasource
				Expr       string
			}
		}
	}
	if err := json.Unmarshal([]byte(text), &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if !slices.ContainsFunc(d.Templating.List, func(v variable) bool {
		return v.Type == "datasource" && v.Name == "datasource" && string(v.Query) == `"prometheus"`
	}) {
		t.Error("dashboard.json has no Prometheus datasource variable named datasource")
	}
	want := datasource{Type: "prometheus", UID: "${datasource}"}
	queries := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || *p.Datasource != want {
			t.Errorf("dashboard.json: panel %q has data source %v, want %v", p.Title, p.Datasource, want)
		}
		for _, q := range p.Targets {
			queries++
			if q.Datasource == nil || *q.Datasource != want || q.Expr == "" {
				t.Errorf("dashboard.json: panel %q has a query %q on data source %v, want one on %v", p.Title, q.Expr, q.Datasource, want)
			}
		}
	}
	if queries == 0 {
		t.Error("dashboard.json has no query")
	}
}

// read returns the file name of docs/monitoring.
func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(monitoringDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// listen returns a listener on a loopback port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}
