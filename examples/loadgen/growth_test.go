package main

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestGrowth fills a key table to two small sizes and checks that each was
// reached and measured, not how fast anything was.
func TestGrowth(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	cfg := defaultConfig()
	cfg.Duration = 500 * time.Millisecond
	cfg.Warmup = 100 * time.Millisecond
	cfg.Clients, cfg.PoolSize = 2, 2
	cfg.Growth.Sizes = []int{2000, 5000}
	cfg.Growth.Scenarios = []string{"atomic", "replay"}
	cfg.Growth.SweepRows = 1000
	dir := t.TempDir()
	cfg.MarkdownPath, cfg.JSONPath = filepath.Join(dir, "growth.md"), filepath.Join(dir, "growth.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := runGrowth(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 || len(rep.Runs[0].Steps) != 2 {
		t.Fatalf("%d runs, want one of two sizes: %+v", len(rep.Runs), rep.Runs)
	}
	for i, p := range rep.Runs[0].Steps {
		// The table holds at least the size filled to, the scenarios'
		// own keys besides (the expired ones are swept).
		if p.Rows < int64(cfg.Growth.Sizes[i]) || p.PKeyBytes == 0 || p.SharedBuffersBytes == 0 {
			t.Errorf("size %d: %+v", cfg.Growth.Sizes[i], p)
		}
		for _, s := range cfg.Growth.Scenarios {
			if g := p.Scenarios[s]; g.PerSecond <= 0 || g.Errors != 0 {
				t.Errorf("size %d, %s: %+v", cfg.Growth.Sizes[i], s, g)
			}
		}
		if p.SweptPerSecond <= 0 {
			t.Errorf("size %d: the sweeper deleted nothing", cfg.Growth.Sizes[i])
		}
	}
	if err := writeGrowthOutputs(cfg, rep, io.Discard); err != nil {
		t.Fatal(err)
	}
	md := readFile(t, cfg.MarkdownPath)
	for _, want := range []string{"| 2 k |", "| 5 k |", "atomic req/s (÷ first size)"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown has no %q:\n%s", want, md)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("1M, 250K,30000000")
	if err != nil || !slices.Equal(got, []int{1_000_000, 250_000, 30_000_000}) {
		t.Errorf("parseSizes = %v, %v", got, err)
	}
	for _, bad := range []string{"1G", "-1", "M", "0"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("parseSizes(%q) succeeded", bad)
		}
	}
}
