package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.Run(m))
}

// TestScenarios runs every scenario briefly and checks what the counters
// say, not how fast anything was.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	dir := t.TempDir()
	cfg := defaultConfig()
	cfg.Duration = time.Second
	cfg.Warmup = 500 * time.Millisecond
	cfg.Clients = 4
	cfg.PoolSize = 4
	cfg.StormDuplicates = 4
	cfg.JSONPath = filepath.Join(dir, "out.json")
	cfg.MarkdownPath = filepath.Join(dir, "out.md")
	cfg.SVGPath = filepath.Join(dir, "out.svg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	reps, err := run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 1 {
		t.Fatalf("%d reports, want one for the one round-trip time", len(reps))
	}
	rep := reps[0]
	if err := writeOutputs(cfg, reps, io.Discard); err != nil {
		t.Fatal(err)
	}
	by := map[string]*summary{}
	for _, s := range rep.Scenarios {
		by[s.Scenario] = s
		if s.Requests == 0 || s.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors (%v)", s.Scenario, s.Requests, s.Errors, s.rounds[0].FirstError)
		}
		if s.RoundTrips == nil || s.Commits == nil {
			t.Fatalf("%s: not counted", s.Scenario)
		}
	}
	for _, name := range defaultScenarios() {
		if by[name] == nil {
			t.Fatalf("scenario %s missing from the report", name)
		}
	}

	exact := func(name, what string, got *float64, want float64) {
		t.Helper()
		if *got != want {
			t.Errorf("%s: %s per request = %v, want %v", name, what, *got, want)
		}
	}
	// A first execution under idem costs what the handler alone costs.
	exact("baseline", "round trips", by["baseline"].RoundTrips, 3)
	exact("atomic", "round trips", by["atomic"].RoundTrips, *by["baseline"].RoundTrips)
	exact("baseline", "commits", by["baseline"].Commits, 1)
	exact("atomic", "commits", by["atomic"].Commits, *by["baseline"].Commits)
	exact("sql-atomic", "round trips", by["sql-atomic"].RoundTrips, *by["sql-baseline"].RoundTrips)
	exact("sql-atomic", "commits", by["sql-atomic"].Commits, 1)
	// The floor sends what sql-atomic sends, without the claim's work.
	exact("sql-floor", "round trips", by["sql-floor"].RoundTrips, *by["sql-atomic"].RoundTrips)
	exact("sql-floor", "commits", by["sql-floor"].Commits, *by["sql-atomic"].Commits)
	exact("sql-floor", "rollbacks", by["sql-floor"].Rollbacks, 0)
	exact("sql-floor", "round trips over the floor", by["sql-floor"].RoundTripsOverFloor, 0)
	exact("naive", "round trips over the floor", by["naive"].RoundTripsOverFloor, 3)
	// A replay reads and rolls back: no commit. Counting replays adds a
	// write of a batch of keys' counts now and then, never one per replay.
	exact("replay-uncounted", "round trips", by["replay-uncounted"].RoundTrips, 2)
	exact("replay-uncounted", "commits", by["replay-uncounted"].Commits, 0)
	if rt, c := *by["replay"].RoundTrips, *by["replay"].Commits; rt < 2 || rt > 2.05 || c > 0.05 {
		t.Errorf("replay: %v round trips and %v commits per request, want 2 and 0, and a batch of counts' write per 20 requests at most", rt, c)
	}
	exact("naive", "round trips", by["naive"].RoundTrips, 6)
	exact("naive", "commits", by["naive"].Commits, 1)
	// Leased mode commits three times where atomic commits once: the claim
	// (one round trip of six statements: BEGIN, the lock timeout, the key's
	// lock, the insert, the read of the holder, COMMIT), the handler's own
	// transaction (what baseline sends), and the record (one round trip of
	// four statements: BEGIN, the lock timeout, the UPDATE, COMMIT).
	exact("leased", "round trips", by["leased"].RoundTrips, *by["baseline"].RoundTrips+2)
	exact("leased", "commits", by["leased"].Commits, 3)
	exact("leased", "statements", by["leased"].Statements, *by["baseline"].Statements+10)
	exact("leased", "rollbacks", by["leased"].Rollbacks, 0)
	if o := by["leased"].Outcomes; o[string(replayed)] != 0 || o[string(executed)] != by["leased"].Requests {
		t.Errorf("leased outcomes %v, want only first executions", o)
	}
	for _, name := range []string{"replay", "replay-uncounted"} {
		if o := by[name].Outcomes; o[string(executed)] != 0 {
			t.Errorf("%s executed %d requests", name, o[string(executed)])
		}
	}
	if o := by["storm"].Outcomes; o[string(executed)] == 0 || o[string(replayed)] == 0 {
		t.Errorf("storm outcomes %v, want both executed and replayed", o)
	}
	if c := *by["storm"].Commits; c <= 0 || c >= 1 {
		t.Errorf("storm: %v commits per request, want between 0 and 1", c)
	}
	// Optimistic mode sends what atomic sends; its replays run the
	// handler and roll it back, then claim again.
	exact("optimistic", "round trips", by["optimistic"].RoundTrips, *by["baseline"].RoundTrips)
	exact("optimistic", "commits", by["optimistic"].Commits, 1)
	exact("sql-optimistic", "round trips", by["sql-optimistic"].RoundTrips, *by["sql-floor"].RoundTrips)
	exact("sql-optimistic", "commits", by["sql-optimistic"].Commits, 1)
	if c := *by["optimistic-replay"].Commits; c > 0.05 {
		t.Errorf("optimistic-replay: %v commits per request, want 0 but for a batch of counts' write per 20 requests at most", c)
	}
	if o := by["optimistic-replay"].Outcomes; o[string(executed)] != 0 {
		t.Errorf("optimistic-replay executed %d requests", o[string(executed)])
	}
	if o := by["optimistic-storm"].Outcomes; o[string(executed)] == 0 || o[string(replayed)] == 0 {
		t.Errorf("optimistic-storm outcomes %v, want both executed and replayed", o)
	}
	// Auto mode sends a first attempt's statements as optimistic mode does,
	// and claims a retry as atomic mode does: one round trip, no commit.
	exact("auto", "round trips", by["auto"].RoundTrips, *by["baseline"].RoundTrips)
	exact("auto", "commits", by["auto"].Commits, 1)
	exact("auto", "statements", by["auto"].Statements, *by["optimistic"].Statements)
	// As replay, within a batch of counts' write per 20 requests.
	if rt, st := *by["auto-replay"].RoundTrips, *by["auto-replay"].Statements; rt < 2 || rt > 2.05 || st < *by["replay-uncounted"].Statements || st > *by["replay-uncounted"].Statements+0.1 {
		t.Errorf("auto-replay: %v round trips and %v statements per request, want replay-uncounted's, 2 and %v, and a batch of counts' write per 20 requests at most", rt, st, *by["replay-uncounted"].Statements)
	}
	if c := *by["auto-replay"].Commits; c > 0.05 {
		t.Errorf("auto-replay: %v commits per request, want 0 but for a batch of counts' write per 20 requests at most", c)
	}
	if o := by["auto-replay"].Outcomes; o[string(executed)] != 0 {
		t.Errorf("auto-replay executed %d requests", o[string(executed)])
	}
	if o := by["auto-storm"].Outcomes; o[string(executed)] == 0 || o[string(replayed)] == 0 {
		t.Errorf("auto-storm outcomes %v, want both executed and replayed", o)
	}
	// A mixed workload replays its share of retries and executes the rest
	// (of the calls that ended in the measured second: a replay ends
	// sooner than a first execution, hence the margin).
	for _, mode := range []string{"atomic", "optimistic", "auto"} {
		for _, p := range retryShares {
			name := fmt.Sprintf("mixed-%s-%d", mode, p)
			s := by[name]
			replays := float64(s.Outcomes[string(replayed)]) / float64(s.Requests)
			if d := replays - float64(p)/100; d < -0.05 || d > 0.05 {
				t.Errorf("%s: %.3f of the calls replayed, want %.2f", name, replays, float64(p)/100)
			}
		}
	}

	// -replot renders the same report from the JSON alone.
	again := cfg
	again.JSONPath, again.MarkdownPath, again.SVGPath = "", filepath.Join(dir, "again.md"), ""
	if err := replotScenarios(again, cfg.JSONPath, io.Discard); err != nil {
		t.Fatal(err)
	}
	if a, b := readFile(t, cfg.MarkdownPath), readFile(t, again.MarkdownPath); a != b {
		t.Errorf("-replot's markdown differs from the run's:\n%s\n---\n%s", b, a)
	}

	var decoded report
	b, err := os.ReadFile(cfg.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &decoded); err != nil {
		t.Fatal(err)
	}
	if len(decoded.Scenarios) != len(rep.Scenarios) || len(decoded.Targets) == 0 {
		t.Errorf("JSON has %d scenarios and %d targets", len(decoded.Scenarios), len(decoded.Targets))
	}
	if decoded.Config.PGRTT != "0s" || decoded.Config.PGAddr != "" || decoded.PingP50ms == nil {
		t.Errorf("JSON says pg_rtt %q, pg_addr %q, ping %v; want 0s, no proxy, a ping time", decoded.Config.PGRTT, decoded.Config.PGAddr, decoded.PingP50ms)
	}
	md, err := os.ReadFile(cfg.MarkdownPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| round trips − sql-floor |", "Handler (`-handler payment`): "} {
		if !strings.Contains(string(md), want) {
			t.Errorf("markdown has no %q:\n%s", want, md)
		}
	}
	if decoded.Config.Handler != "payment" {
		t.Errorf("JSON says handler %q, want payment", decoded.Config.Handler)
	}
	for _, s := range rep.Scenarios {
		if !strings.Contains(string(md), "| "+s.Scenario+" |") {
			t.Errorf("markdown has no row for %s", s.Scenario)
		}
	}
	if !strings.Contains(string(md), "Round trip to PostgreSQL: no delay added") {
		t.Errorf("markdown does not say at which round-trip time it measured:\n%s", md)
	}
	svg, err := os.ReadFile(cfg.SVGPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(svg), "round trip to PostgreSQL: loopback</text>") {
		t.Errorf("SVG title does not give the round-trip time:\n%s", svg)
	}
	if !strings.HasPrefix(string(svg), "<svg") || !strings.Contains(string(svg), ">atomic<") || !strings.Contains(string(svg), ">leased<") {
		t.Errorf("SVG does not look like the chart:\n%s", svg)
	}
	if !strings.Contains(string(svg), "atomic ÷ leased ") {
		t.Errorf("SVG does not show atomic ÷ leased:\n%s", svg)
	}
	var leased *target
	for i, tg := range decoded.Targets {
		if tg.Numerator == "atomic" && tg.Denominator == "leased" {
			leased = &decoded.Targets[i]
		}
	}
	if leased == nil || leased.Measured == nil || *leased.Measured <= 0 {
		t.Errorf("JSON target atomic ÷ leased = %+v, want a measured ratio", leased)
	}
	if !strings.Contains(string(md), "| atomic throughput ÷ leased | ≥ 1.30 | ") {
		t.Errorf("markdown has no atomic ÷ leased target:\n%s", md)
	}
}

// TestRoundTripTimes runs two scenarios at no added delay and through the
// delay proxy: at the longer round-trip time every request takes at least
// its round trips times that, the counts stay what they were, and the
// report holds both.
func TestRoundTripTimes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	const rtt = 2 * time.Millisecond
	dir := t.TempDir()
	cfg := defaultConfig()
	cfg.Duration = time.Second
	cfg.Warmup = 200 * time.Millisecond
	cfg.Clients = 2
	cfg.PoolSize = 2
	cfg.Scenarios = []string{"baseline", "naive"}
	cfg.RTTs = []time.Duration{0, rtt}
	cfg.JSONPath = filepath.Join(dir, "out.json")
	cfg.MarkdownPath = filepath.Join(dir, "out.md")
	cfg.SVGPath = filepath.Join(dir, "out.svg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	reps, err := run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 {
		t.Fatalf("%d reports, want one per round-trip time", len(reps))
	}
	direct, delayed := reps[0], reps[1]
	if direct.Config.PGRTT != "0s" || delayed.Config.PGRTT != "2ms" || delayed.Config.PGAddr == "" {
		t.Errorf("reports at %q and %q (via %q), want 0s and 2ms via PostgreSQL's TCP address", direct.Config.PGRTT, delayed.Config.PGRTT, delayed.Config.PGAddr)
	}
	if p := delayed.PingP50ms; p == nil || *p < ms(rtt) {
		t.Errorf("an empty query through the proxy took %v ms, want at least %v", p, rtt)
	}
	for _, rep := range reps {
		for _, s := range rep.Scenarios {
			if s.Requests == 0 || s.Errors != 0 {
				t.Errorf("%s at %s: %d requests, %d errors", s.Scenario, rep.Config.PGRTT, s.Requests, s.Errors)
			}
		}
	}
	for i, want := range []float64{3, 6} { // baseline, naive
		for _, rep := range reps {
			s := rep.Scenarios[i]
			if s.RoundTrips == nil || *s.RoundTrips != want {
				t.Errorf("%s at %s: %v round trips per request, want %v", s.Scenario, rep.Config.PGRTT, s.RoundTrips, want)
			}
		}
		// The proxy never delivers early: a request takes at least its
		// round trips.
		if s := delayed.Scenarios[i]; s.P50ms < want*ms(rtt) {
			t.Errorf("%s at %v: p50 %.2f ms, want at least %v round trips of %v", s.Scenario, rtt, s.P50ms, want, rtt)
		}
	}

	if err := writeOutputs(cfg, reps, io.Discard); err != nil {
		t.Fatal(err)
	}
	var decoded rttReports
	b, err := os.ReadFile(cfg.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &decoded); err != nil {
		t.Fatal(err)
	}
	if len(decoded.Latencies) != 2 || len(decoded.Ratios) != 2 || decoded.Ratios[1].PGRTT != "2ms" || len(decoded.Latencies[1].Scenarios) != 2 {
		t.Errorf("JSON does not hold both round-trip times:\n%s", b)
	}
	for _, r := range decoded.Ratios {
		if r.PerSecond["naive"] <= 0 || len(r.Targets) != len(keyRatios) {
			t.Errorf("JSON ratios at %s: %+v", r.PGRTT, r)
		}
	}
	md, err := os.ReadFile(cfg.MarkdownPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| round trip | empty query p50 ms |", "| loopback | ", "| 2ms | ", "**Round trip loopback**", "**Round trip 2ms**: 2ms added"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("markdown has no %q:\n%s", want, md)
		}
	}
	if n := strings.Count(string(md), "| naive |"); n != 2 {
		t.Errorf("markdown has %d rows for naive, want one per round-trip time", n)
	}
	svg, err := os.ReadFile(cfg.SVGPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "round trip to PostgreSQL: loopback, 2ms<", ">req/s at loopback<", ">req/s at 2ms round trip<"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("SVG has no %q:\n%s", want, svg)
		}
	}
}

func TestParseRTTs(t *testing.T) {
	got, err := parseRTTs("0, 200us,1ms")
	if err != nil || len(got) != 3 || got[0] != 0 || got[1] != 200*time.Microsecond || got[2] != time.Millisecond {
		t.Errorf("parseRTTs = %v, %v", got, err)
	}
	for _, bad := range []string{"", "1", "-1ms", "1ms,x"} {
		if _, err := parseRTTs(bad); err == nil {
			t.Errorf("parseRTTs(%q) accepted", bad)
		}
	}
}

func TestTCPListenHost(t *testing.T) {
	for _, tc := range []struct {
		listen, host string
		ok           bool
	}{
		{"", "", false},
		{"localhost", "127.0.0.1", true},
		{"*", "127.0.0.1", true},
		{"10.0.0.5, 127.0.0.1", "127.0.0.1", true},
		{"::1", "::1", true},
		{"10.0.0.5,db.internal", "10.0.0.5", true},
	} {
		if host, ok := tcpListenHost(tc.listen); host != tc.host || ok != tc.ok {
			t.Errorf("tcpListenHost(%q) = %q, %v; want %q, %v", tc.listen, host, ok, tc.host, tc.ok)
		}
	}
}

func TestLookupScenario(t *testing.T) {
	if s, err := lookupScenario("leased"); err != nil || s.server == nil {
		t.Errorf("leased: %v, %v", s, err)
	}
	if _, err := lookupScenario("nonesuch"); err == nil {
		t.Error("unknown scenario accepted")
	}
}

// TestPGTCPAddr finds where the delay proxy dials: a connection string's
// own TCP host, else the server's TCP listener, and says so clearly when
// there is none.
func TestPGTCPAddr(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if got, err := pgTCPAddr(ctx, "host=db.example port=6432 user=u", ""); err != nil || got != "db.example:6432" {
		t.Errorf("a TCP connection string gives %q, %v; want its host and port", got, err)
	}
	if got, err := pgTCPAddr(ctx, "host=/nonexistent", "127.0.0.1:7000"); err != nil || got != "127.0.0.1:7000" {
		t.Errorf("-pg-addr gives %q, %v; want it unchanged", got, err)
	}
	if _, err := pgTCPAddr(ctx, "host=/nonexistent", "7000"); err == nil {
		t.Error("-pg-addr without a port accepted")
	}

	// A throwaway cluster listens only on its Unix socket.
	srv, err := pgtest.StartCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, err = pgTCPAddr(ctx, srv.ConnString(), "")
	if err == nil || !strings.Contains(err.Error(), "listens on no TCP address (listen_addresses = '')") {
		t.Fatalf("a server without a TCP listener gives %v, want an error that says so", err)
	}
	cfg := defaultConfig()
	cfg.DatabaseURL = srv.ConnString()
	cfg.PoolSize = cfg.Clients
	cfg.RTTs = []time.Duration{time.Millisecond}
	cfg.Scenarios = []string{"baseline"}
	t.Setenv("DATABASE_URL", "")
	if _, err := run(ctx, cfg, io.Discard); err == nil || !strings.Contains(err.Error(), "-pg-rtt needs PostgreSQL over TCP") {
		t.Fatalf("run at 1ms against a server without a TCP listener: %v, want the error", err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
