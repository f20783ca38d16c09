package main

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/pgtest"
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

// TestBulkLoadSetsBack: on a throwaway cluster, bulkLoad's settings hold
// until restore, and the cluster's own hold again after it, before
// anything is measured.
func TestBulkLoadSetsBack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a throwaway PostgreSQL cluster: runs without -short")
	}
	ctx := t.Context()
	pg, err := pgtest.StartClusterWith(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pg.Close() }()
	pool, err := pgxpool.New(ctx, pg.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	settings := func() string {
		var s string
		err := pool.QueryRow(ctx, "SELECT current_setting('full_page_writes') || ' ' || current_setting('max_wal_size') || ' ' || current_setting('checkpoint_timeout')").Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	own := settings()
	restore, err := bulkLoad(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	// A reload reaches each session when it next reads a command.
	idemtest.WaitFor(t, time.Minute, func() bool { return settings() == "off 32GB 1h" })
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	idemtest.WaitFor(t, time.Minute, func() bool { return settings() == own })
	if own != "on 1GB 5min" {
		t.Errorf("the cluster's own settings are %q, want PostgreSQL's defaults", own)
	}
}
