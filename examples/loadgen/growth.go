package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// growthConfig is what -growth measures: the scenarios at each size of the
// key table, on a server at each shared_buffers.
type growthConfig struct {
	// Sizes are the key rows the table holds before each measurement, in
	// increasing order; the table is filled from one to the next.
	Sizes []int
	// SharedBuffers are the settings of shared_buffers to measure at, each
	// on a throwaway cluster of its own with PostgreSQL's defaults
	// otherwise; none measures on the server pgtest finds, as it is.
	SharedBuffers []string
	// Scenarios run at each size, in the table's database.
	Scenarios []string
	// SweepRows are the expired rows the sweeper deletes at each size.
	SweepRows int
}

func defaultGrowthConfig() growthConfig {
	return growthConfig{Scenarios: []string{"auto", "auto-replay"}, SweepRows: 200_000}
}

// growthReport is a -growth run.
type growthReport struct {
	Command string       `json:"command"`
	Machine machine      `json:"machine"`
	Runs    []growthRun  `json:"runs"`
	Config  growthConfig `json:"config"`
}

// growthRun is one server's measurements, size by size.
type growthRun struct {
	SharedBuffers string        `json:"shared_buffers"`
	Steps         []growthPoint `json:"sizes"`
}

// growthPoint is what was measured at one size of the table.
type growthPoint struct {
	Rows         int64   `json:"rows"`
	FillSeconds  float64 `json:"fill_seconds"`
	HeapBytes    int64   `json:"heap_bytes"`
	PKeyBytes    int64   `json:"primary_key_bytes"`
	IndexesBytes int64   `json:"indexes_bytes"`
	// SharedBuffersBytes is the server's shared_buffers, in bytes.
	SharedBuffersBytes int64                    `json:"shared_buffers_bytes"`
	Scenarios          map[string]growthMeasure `json:"scenarios"`
	// SweptPerSecond is the rows per second a Sweeper deleted, in batches
	// of 1000 with no pause, of SweepRows expired rows.
	SweptPerSecond float64 `json:"swept_per_second"`
}

// growthMeasure is one scenario at one size.
type growthMeasure struct {
	PerSecond float64 `json:"per_second"`
	P99ms     float64 `json:"p99_ms"`
	Errors    int64   `json:"errors"`
	// IndexHitPercent is the share of the key table's index blocks the
	// scenario found in shared_buffers (pg_statio_user_indexes).
	IndexHitPercent *float64 `json:"index_hit_percent,omitempty"`
}

// runGrowth runs -growth.
func runGrowth(ctx context.Context, cfg config, log io.Writer) (*growthReport, error) {
	gc := cfg.Growth
	if len(gc.Sizes) == 0 || !slices.IsSorted(gc.Sizes) || gc.Sizes[0] < 1 {
		return nil, errors.New("-growth takes increasing sizes, e.g. 1M,10M,30M")
	}
	h, err := lookupHandler(cfg.Handler)
	if err != nil {
		return nil, err
	}
	var list []*scenario
	for _, name := range gc.Scenarios {
		s, err := lookupScenario(name)
		if err != nil {
			return nil, err
		}
		if s.server == nil && !strings.HasPrefix(s.name, "sql-") {
			return nil, fmt.Errorf("scenario %s cannot run in -growth", name)
		}
		list = append(list, s)
	}
	if cfg.DatabaseURL != "" {
		if err := os.Setenv("DATABASE_URL", cfg.DatabaseURL); err != nil {
			return nil, err
		}
	}
	rep := &growthReport{Command: cfg.forReport().Command, Config: gc}
	settings := gc.SharedBuffers
	if len(settings) == 0 {
		settings = []string{""}
	}
	for _, sb := range settings {
		var pg *pgtest.Server
		if sb == "" {
			pg, err = pgtest.Start(ctx)
		} else {
			fmt.Fprintf(log, "growth: a throwaway cluster with shared_buffers = %s\n", sb)
			pg, err = pgtest.StartClusterWith(ctx, "shared_buffers = '"+sb+"'")
		}
		if err != nil {
			return nil, err
		}
		run, m, err := growOne(ctx, cfg, h, pg, sb != "", list, log)
		_ = pg.Close()
		if err != nil {
			return nil, err
		}
		rep.Machine = m
		run.SharedBuffers = sb
		if sb == "" {
			run.SharedBuffers = bytesLabel(float64(run.Steps[0].SharedBuffersBytes)) + " (the server's)"
		}
		rep.Runs = append(rep.Runs, *run)
	}
	return rep, nil
}

// growOne measures on pg: it fills a database's key table to each size in
// turn, and at each runs the scenarios in that database and the sweeper.
// On a throwaway cluster the fills run with the settings of a bulk load
// (see bulkLoad), and each measurement with the cluster's own.
func growOne(ctx context.Context, cfg config, h *handler, pg *pgtest.Server, throwaway bool, list []*scenario, log io.Writer) (*growthRun, machine, error) {
	m := describeMachine(ctx, pg)
	dsn, drop, err := pg.CreateDatabase(ctx)
	if err != nil {
		return nil, m, err
	}
	defer func() { _ = drop(context.WithoutCancel(ctx)) }()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, m, err
	}
	defer pool.Close()
	if err := makeSchemas(ctx, pool, h); err != nil {
		return nil, m, err
	}
	// The row every other is a copy of, as -capacity makes them.
	e := newEnv(cfg, h, "")
	key := uuid()
	claim, err := postgres.New(pool).Claim(ctx, store.Scope{Tenant: tenant, Method: createPayment, Key: key}, store.ClaimRequest{Fingerprint: e.fingerprint})
	if err != nil {
		return nil, m, err
	}
	if claim.Txn == nil {
		return nil, m, errors.New("a fresh key was taken")
	}
	if err := claim.Txn.Record(ctx, store.Outcome{Body: e.response}); err != nil {
		return nil, m, err
	}
	clone, err := cloneStatement(ctx, pool)
	if err != nil {
		return nil, m, err
	}

	run := &growthRun{}
	for _, size := range cfg.Growth.Sizes {
		var have int64
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys").Scan(&have); err != nil {
			return nil, m, err
		}
		p := growthPoint{Scenarios: map[string]growthMeasure{}}
		fmt.Fprintf(log, "growth: filling the key table from %d to %d rows\n", have, size)
		t0 := time.Now()
		if n := int64(size) - have; n > 0 {
			restore := func() error { return nil }
			if throwaway {
				if restore, err = bulkLoad(ctx, pool); err != nil {
					return nil, m, err
				}
			}
			err := fill(ctx, pool, clone, key, int(have), int(n), false)
			if err := errors.Join(err, restore()); err != nil {
				return nil, m, err
			}
		}
		for _, q := range []string{"VACUUM (ANALYZE) idempotency_keys", "CHECKPOINT"} {
			if _, err := pool.Exec(ctx, q); err != nil {
				return nil, m, err
			}
		}
		p.FillSeconds = time.Since(t0).Seconds()
		err := pool.QueryRow(ctx, `SELECT count(*), pg_relation_size('idempotency_keys'),
    pg_relation_size('idempotency_keys_pkey'), pg_indexes_size('idempotency_keys'),
    (SELECT setting::bigint * 8192 FROM pg_settings WHERE name = 'shared_buffers')
FROM idempotency_keys`).Scan(&p.Rows, &p.HeapBytes, &p.PKeyBytes, &p.IndexesBytes, &p.SharedBuffersBytes)
		if err != nil {
			return nil, m, err
		}
		for _, s := range list {
			before, err := indexBlocks(ctx, pool)
			if err != nil {
				return nil, m, err
			}
			fmt.Fprintf(log, "growth: %d rows: %s ", p.Rows, s.name)
			r, err := runOn(ctx, cfg, h, pg, dsn, nil, 0, s, 0)
			if err != nil {
				fmt.Fprintln(log)
				return nil, m, fmt.Errorf("%s at %d rows: %w", s.name, p.Rows, err)
			}
			after, err := indexBlocks(ctx, pool)
			if err != nil {
				return nil, m, err
			}
			sortDurations(r.latencies)
			g := growthMeasure{PerSecond: r.throughput(), P99ms: ms(percentile(r.latencies, 99)), Errors: r.Errors}
			if hit, read := after[0]-before[0], after[1]-before[1]; hit+read > 0 {
				g.IndexHitPercent = ptr(100 * float64(hit) / float64(hit+read))
			}
			fmt.Fprintf(log, "%.0f req/s\n", g.PerSecond)
			p.Scenarios[s.name] = g
		}
		// The sweeper: expired rows appended behind the live ones,
		// deleted in the library's batches without a pause between them.
		if err := fill(ctx, pool, clone, key, 0, cfg.Growth.SweepRows, true); err != nil {
			return nil, m, err
		}
		if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) idempotency_keys"); err != nil {
			return nil, m, err
		}
		sw := postgres.NewSweeper(pool, postgres.WithBatchSize(sweepBatchSize), postgres.WithPause(0))
		t1 := time.Now()
		n, err := sw.Sweep(ctx)
		if err != nil {
			return nil, m, err
		}
		p.SweptPerSecond = float64(n) / time.Since(t1).Seconds()
		fmt.Fprintf(log, "growth: %d rows: swept %d expired rows, %.0f rows/s\n", p.Rows, n, p.SweptPerSecond)
		run.Steps = append(run.Steps, p)
	}
	return run, m, nil
}

// bulkLoad sets a throwaway cluster up for a fill of millions of rows, and
// returns a function that sets it back. A fill inserts each row at a
// random place of the primary key; once that index outgrows shared_buffers,
// nearly every insert dirties a page not written since the last
// checkpoint, which the write-ahead log then holds whole (8 kB a row), and
// a checkpoint comes every max_wal_size of it. Without full-page images and
// with checkpoints far apart, the same rows and index pages are written at
// a fraction of the cost. A crash during the fill could leave the cluster
// unreadable, which on a throwaway cluster costs only the run.
func bulkLoad(ctx context.Context, pool *pgxpool.Pool) (restore func() error, err error) {
	settings := map[string]string{"full_page_writes": "off", "max_wal_size": "32GB", "checkpoint_timeout": "1h"}
	apply := func(ctx context.Context, set bool) error {
		for name, value := range settings {
			q := "ALTER SYSTEM RESET " + name
			if set {
				q = "ALTER SYSTEM SET " + name + " = '" + value + "'"
			}
			if _, err := pool.Exec(ctx, q); err != nil {
				return err
			}
		}
		_, err := pool.Exec(ctx, "SELECT pg_reload_conf()")
		return err
	}
	if err := apply(ctx, true); err != nil {
		return nil, errors.Join(err, apply(context.WithoutCancel(ctx), false))
	}
	return func() error { return apply(context.WithoutCancel(ctx), false) }, nil
}

// indexBlocks returns the blocks of the key table's indexes found in
// shared_buffers and read from outside it, so far.
func indexBlocks(ctx context.Context, pool *pgxpool.Pool) ([2]int64, error) {
	var b [2]int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(idx_blks_hit), 0), coalesce(sum(idx_blks_read), 0)
FROM pg_statio_user_indexes WHERE relname = 'idempotency_keys'`).Scan(&b[0], &b[1])
	return b, err
}

// parseSizes parses a comma-separated list of row counts, each a number
// with an optional K or M suffix (1M, 250K, 30000000).
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		mult := 1
		switch {
		case strings.HasSuffix(f, "M"):
			mult, f = 1_000_000, strings.TrimSuffix(f, "M")
		case strings.HasSuffix(f, "K"):
			mult, f = 1_000, strings.TrimSuffix(f, "K")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("row count %q: want a positive number, with K or M", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

// writeGrowthOutputs writes the -json and -markdown of a -growth run.
func writeGrowthOutputs(cfg config, rep *growthReport, stdout io.Writer) error {
	var md strings.Builder
	rep.markdown(&md)
	if cfg.MarkdownPath != "" {
		if err := os.WriteFile(cfg.MarkdownPath, []byte(md.String()), 0o644); err != nil {
			return err
		}
	} else {
		fmt.Fprint(stdout, md.String())
	}
	if cfg.JSONPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(cfg.JSONPath, append(b, '\n'), 0o644)
	}
	return nil
}

// markdown writes a table per shared_buffers setting: a row per size, the
// scenarios' throughput and its ratio to the smallest size's.
func (rep *growthReport) markdown(w io.Writer) {
	fmt.Fprintf(w, "Command: `%s`\n\n%s\n", rep.Command, rep.Machine.caption())
	for _, run := range rep.Runs {
		fmt.Fprintf(w, "\n**shared_buffers %s**\n\n", run.SharedBuffers)
		head := "| key rows | heap | primary key | all indexes | primary key in shared_buffers |"
		align := "|---:|---:|---:|---:|---|"
		for _, s := range rep.Config.Scenarios {
			head += fmt.Sprintf(" %s req/s (÷ first size) | %s p99 ms | %s index hits |", s, s, s)
			align += "---:|---:|---:|"
		}
		head += " sweeper rows/s (÷ first size) | fill s |"
		align += "---:|---:|"
		fmt.Fprintln(w, head)
		fmt.Fprintln(w, align)
		for _, p := range run.Steps {
			fits := "yes"
			if p.PKeyBytes > p.SharedBuffersBytes {
				fits = "no"
			}
			row := fmt.Sprintf("| %s | %s | %s | %s | %s |", count(float64(p.Rows)), bytesLabel(float64(p.HeapBytes)),
				bytesLabel(float64(p.PKeyBytes)), bytesLabel(float64(p.IndexesBytes)), fits)
			for _, s := range rep.Config.Scenarios {
				g, first := p.Scenarios[s], run.Steps[0].Scenarios[s]
				hits := "—"
				if g.IndexHitPercent != nil {
					hits = fmt.Sprintf("%.1f %%", *g.IndexHitPercent)
				}
				row += fmt.Sprintf(" %.0f (%.2f) | %.2f | %s |", g.PerSecond, g.PerSecond/first.PerSecond, g.P99ms, hits)
			}
			row += fmt.Sprintf(" %.0f (%.2f) | %.0f |", p.SweptPerSecond, p.SweptPerSecond/run.Steps[0].SweptPerSecond, p.FillSeconds)
			fmt.Fprintln(w, row)
		}
	}
}
