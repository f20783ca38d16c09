// Binary loadgen measures what idem costs: it runs the payments service's
// CreatePayment under load, with and without the idem interceptor, and
// reports throughput, latency, and the PostgreSQL round trips and commits
// each request took, next to a baseline measured in the same run.
//
//	go run ./examples/loadgen -duration 10s -clients 32 -rounds 3 \
//	    -json examples/loadgen/results.json -markdown results.md \
//	    -svg examples/loadgen/results.svg
//
// Every scenario runs in this process: a gRPC server on 127.0.0.1:0 with its
// own connection pool and a fresh database (created by pgtest on
// -database-url, $DATABASE_URL, the libpq defaults or a throwaway cluster),
// and -clients concurrent callers over loopback gRPC. Round trips are
// counted on the pool's network connections and commits by a pgx tracer.
// Rounds run every scenario once, in an order that rotates from round to
// round, so that drift on a shared machine falls on all of them alike.
//
// -pg-rtt puts a proxy between the scenarios' pools and PostgreSQL that
// delays each direction by half the given round-trip time; a
// comma-separated list (-pg-rtt 0,200us,1ms) runs every round at each and
// reports them side by side.
//
// -handler ledger makes CreatePayment write three rows (the payment, the
// customer's balance, a ledger entry) in every scenario instead of the
// payment alone.
//
// -target sends the idem scenarios to a running payments server instead
// (see examples/payments/server); nothing is counted on the database then.
//
// -soak 10m runs one long load instead, with keys that expire after -ttl
// and a sweeper deleting them, and samples the key table, autovacuum and
// the sweeper over time (soak.json, soak.svg). -capacity measures what a
// key row takes on disk and how fast the sweeper deletes. -growth 1M,10M,30M
// measures scenarios and the sweeper as the key table grows, at each
// -growth-shared-buffers. They are described in the README and
// docs/capacity.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg := defaultConfig()
	var scenarios, cpuProfile, rtts string
	var capacity bool
	var growth, growthBuffers, growthScenarios string
	var replot, rereport string
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long each scenario is measured per round")
	flag.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "unmeasured load before each measurement")
	flag.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent callers")
	flag.IntVar(&cfg.PoolSize, "pool", cfg.PoolSize, "PostgreSQL connections per scenario (default: -clients)")
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "rounds; each runs every scenario once")
	flag.IntVar(&cfg.StormDuplicates, "storm-duplicates", cfg.StormDuplicates, "requests per key in the storm scenario")
	flag.StringVar(&scenarios, "scenarios", strings.Join(cfg.Scenarios, ","), "comma-separated scenarios: "+strings.Join(defaultScenarios(), ", "))
	flag.StringVar(&cfg.Handler, "handler", cfg.Handler, "what CreatePayment writes in every scenario: "+handlerUsage())
	flag.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL server to create the scenarios' databases on (default $DATABASE_URL, else the libpq defaults, else a throwaway cluster)")
	flag.StringVar(&cfg.Target, "target", "", "address of a running payments server; runs only the idem scenarios, against it, without database counters")
	flag.StringVar(&cfg.JSONPath, "json", "", "write the results as JSON to this file")
	flag.StringVar(&cfg.MarkdownPath, "markdown", "", "write the markdown report to this file")
	flag.StringVar(&cfg.SVGPath, "svg", "", "write a chart of throughput and p99 latency to this file")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.StringVar(&cfg.ProfileDir, "pprof-dir", "", "write a CPU profile of each scenario's first measured round to this directory")
	flag.StringVar(&rtts, "pg-rtt", "0", "round-trip time added between the scenarios' pools and PostgreSQL by a delaying proxy, e.g. 1ms; a comma-separated list (0,200us,1ms) runs every round at each; 0 adds no proxy")
	flag.StringVar(&cfg.PGAddr, "pg-addr", "", "PostgreSQL's TCP address for the -pg-rtt proxy to dial (default: the server's host and port when reached over TCP, else its TCP listener from listen_addresses and port)")
	flag.BoolVar(&cfg.SampleWaits, "pg-waits", false, "sample pg_stat_activity every 10ms and report where the scenario's backends spent their time")
	flag.DurationVar(&cfg.Soak.Duration, "soak", 0, "run a soak of this length instead of the scenarios: atomic-mode CreatePayment with fresh keys kept for -ttl, a sweeper deleting them, the key table sampled every -soak-sample")
	flag.DurationVar(&cfg.Soak.TTL, "ttl", cfg.Soak.TTL, "with -soak: how long the store keeps a key")
	flag.DurationVar(&cfg.Soak.Sample, "soak-sample", cfg.Soak.Sample, "with -soak: the sampling interval")
	flag.DurationVar(&cfg.Soak.SweepInterval, "sweep-interval", cfg.Soak.SweepInterval, "with -soak: the sweeper's wait between passes")
	flag.IntVar(&cfg.Soak.SweepBatch, "sweep-batch", cfg.Soak.SweepBatch, "with -soak: rows per sweeper batch")
	flag.DurationVar(&cfg.Soak.SweepPause, "sweep-pause", cfg.Soak.SweepPause, "with -soak: the sweeper's pause between batches")
	flag.Float64Var(&cfg.Soak.Replays, "soak-replays", cfg.Soak.Replays, "with -soak: the share of calls that resend the client's last executed key, and are replayed")
	flag.BoolVar(&cfg.Soak.VacuumTruncate, "vacuum-truncate", cfg.Soak.VacuumTruncate, "with -soak: turn the key table's vacuum_truncate back on (PostgreSQL's default, which migration 0006 turns off), so that vacuum takes an ACCESS EXCLUSIVE lock to truncate the table")
	flag.BoolVar(&cfg.Soak.Throwaway, "soak-throwaway", false, "with -soak: run on a throwaway cluster of PostgreSQL's default settings (autovacuum on) rather than the server pgtest finds")
	flag.StringVar(&cfg.Soak.SharedBuffers, "soak-shared-buffers", "", "with -soak-throwaway: the throwaway cluster's shared_buffers, such as 2GB (default: PostgreSQL's, 128MB)")
	flag.StringVar(&rereport, "replot", "", "write the -json, -markdown and -svg of the scenarios' run in this JSON file again, with this loadgen's targets, without running it")
	flag.StringVar(&replot, "soak-replot", "", "write the -svg chart and -markdown of the soak in this JSON file again, without running it")
	flag.BoolVar(&capacity, "capacity", false, "measure instead of the scenarios what a key row takes on disk (from -capacity-rows rows) and how fast the sweeper deletes expired rows")
	flag.IntVar(&cfg.Capacity.Rows, "capacity-rows", cfg.Capacity.Rows, "with -capacity: rows to measure, and to sweep at each sweeper setting")
	flag.StringVar(&growth, "growth", "", "measure instead -growth-scenarios and the sweeper with the key table filled to each of these sizes in turn, e.g. 1M,10M,30M")
	flag.StringVar(&growthBuffers, "growth-shared-buffers", "", "with -growth: measure on a throwaway cluster at each of these shared_buffers (e.g. 128MB,6GB) rather than on the server found")
	flag.StringVar(&growthScenarios, "growth-scenarios", strings.Join(cfg.Growth.Scenarios, ","), "with -growth: the scenarios to run at each size")
	flag.IntVar(&cfg.Growth.SweepRows, "growth-sweep-rows", cfg.Growth.SweepRows, "with -growth: expired rows the sweeper deletes at each size")
	flag.Parse()
	cfg.Scenarios = splitList(scenarios)
	cfg.Growth.SharedBuffers = splitList(growthBuffers)
	cfg.Growth.Scenarios = splitList(growthScenarios)
	var err error
	if cfg.RTTs, err = parseRTTs(rtts); err != nil {
		fatal(err)
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = cfg.Clients
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	if replot != "" {
		if err := replotSoak(cfg, replot, os.Stdout); err != nil {
			fatal(err)
		}
		return
	}
	if rereport != "" {
		if err := replotScenarios(cfg, rereport, os.Stdout); err != nil {
			fatal(err)
		}
		return
	}
	if capacity {
		rep, err := runCapacity(ctx, cfg, os.Stderr)
		if err != nil {
			fatal(err)
		}
		if err := writeCapacityOutputs(cfg, rep, os.Stdout); err != nil {
			fatal(err)
		}
		return
	}
	if growth != "" {
		if cfg.Growth.Sizes, err = parseSizes(growth); err != nil {
			fatal(err)
		}
		rep, err := runGrowth(ctx, cfg, os.Stderr)
		if err != nil {
			fatal(err)
		}
		if err := writeGrowthOutputs(cfg, rep, os.Stdout); err != nil {
			fatal(err)
		}
		return
	}
	if cfg.Soak.Duration > 0 {
		rep, err := runSoak(ctx, cfg, os.Stderr)
		if err != nil {
			fatal(err)
		}
		if err := writeSoakOutputs(cfg, rep, os.Stdout); err != nil {
			fatal(err)
		}
		return
	}
	reps, err := run(ctx, cfg, os.Stderr)
	if err != nil {
		fatal(err)
	}
	if err := writeOutputs(cfg, reps, os.Stdout); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "loadgen:", err)
	os.Exit(1)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// config is what a run measures and where it writes the results.
type config struct {
	Duration        time.Duration
	Warmup          time.Duration
	Clients         int
	PoolSize        int
	Rounds          int
	StormDuplicates int
	Scenarios       []string
	// Handler names the handler (see [handlers]) of every scenario.
	Handler     string
	DatabaseURL string
	// RTTs are the round-trip times to run at; 0 reaches PostgreSQL
	// directly, more through a delayProxy.
	RTTs []time.Duration
	// PGAddr is the TCP address the delayProxy dials; empty: found.
	PGAddr       string
	Target       string
	JSONPath     string
	MarkdownPath string
	SVGPath      string
	ProfileDir   string
	SampleWaits  bool
	// Soak, when its Duration is set, runs a soak instead of the scenarios.
	Soak soakConfig
	// Capacity is what -capacity measures.
	Capacity capacityConfig
	// Growth is what -growth measures.
	Growth growthConfig
}

func defaultConfig() config {
	return config{
		Duration:        10 * time.Second,
		Warmup:          2 * time.Second,
		Clients:         32,
		Rounds:          1,
		StormDuplicates: 8,
		Scenarios:       defaultScenarios(),
		Handler:         handlers[0].name,
		RTTs:            []time.Duration{0},
		Soak:            defaultSoakConfig(),
		Capacity:        capacityConfig{Rows: 200_000, Sweeps: defaultSweepSettings},
		Growth:          defaultGrowthConfig(),
	}
}
