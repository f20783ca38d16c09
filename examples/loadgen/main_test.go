package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.Run(m))
}

// TestScenarios runs every scenario briefly and checks what the counters
// say, not how fast anything was.
func TestScenarios(t *testing.T) {
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

	rep, err := run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeOutputs(cfg, rep, io.Discard); err != nil {
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
	// A replay reads and rolls back: no commit.
	exact("replay", "round trips", by["replay"].RoundTrips, 2)
	exact("replay", "commits", by["replay"].Commits, 0)
	exact("naive", "round trips", by["naive"].RoundTrips, 6)
	exact("naive", "commits", by["naive"].Commits, 1)
	// Leased mode commits three times where atomic commits once: the claim
	// (one round trip of five statements), the handler's own transaction
	// (what baseline sends), and the record (one autocommit UPDATE).
	exact("leased", "round trips", by["leased"].RoundTrips, *by["baseline"].RoundTrips+2)
	exact("leased", "commits", by["leased"].Commits, 3)
	exact("leased", "statements", by["leased"].Statements, *by["baseline"].Statements+6)
	exact("leased", "rollbacks", by["leased"].Rollbacks, 0)
	if o := by["leased"].Outcomes; o[string(replayed)] != 0 || o[string(executed)] != by["leased"].Requests {
		t.Errorf("leased outcomes %v, want only first executions", o)
	}
	if o := by["replay"].Outcomes; o[string(executed)] != 0 {
		t.Errorf("replay executed %d requests", o[string(executed)])
	}
	if o := by["storm"].Outcomes; o[string(executed)] == 0 || o[string(replayed)] == 0 {
		t.Errorf("storm outcomes %v, want both executed and replayed", o)
	}
	if c := *by["storm"].Commits; c <= 0 || c >= 1 {
		t.Errorf("storm: %v commits per request, want between 0 and 1", c)
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
	md, err := os.ReadFile(cfg.MarkdownPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Scenarios {
		if !strings.Contains(string(md), "| "+s.Scenario+" |") {
			t.Errorf("markdown has no row for %s", s.Scenario)
		}
	}
	svg, err := os.ReadFile(cfg.SVGPath)
	if err != nil {
		t.Fatal(err)
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

func TestLookupScenario(t *testing.T) {
	if s, err := lookupScenario("leased"); err != nil || s.server == nil {
		t.Errorf("leased: %v, %v", s, err)
	}
	if _, err := lookupScenario("nonesuch"); err == nil {
		t.Error("unknown scenario accepted")
	}
}
