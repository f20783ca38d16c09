package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgtest"
)

// report is every scenario measured at one round-trip time to PostgreSQL.
type report struct {
	Config  reportConfig `json:"config"`
	Machine machine      `json:"machine"`
	// PingP50ms is the median time of an empty query on a connection made
	// as the scenarios' pools make theirs; absent with -target.
	PingP50ms *float64       `json:"ping_p50_ms,omitempty"`
	Scenarios []*summary     `json:"scenarios"`
	Targets   []target       `json:"targets"`
	Rounds    []*roundResult `json:"rounds"`
}

type reportConfig struct {
	Command         string   `json:"command"`
	Duration        string   `json:"duration"`
	Warmup          string   `json:"warmup"`
	Clients         int      `json:"clients"`
	PoolSize        int      `json:"pool_size"`
	Rounds          int      `json:"rounds"`
	StormDuplicates int      `json:"storm_duplicates"`
	Scenarios       []string `json:"scenarios"`
	// Handler is what CreatePayment writes in every scenario (-handler).
	Handler string `json:"handler"`
	Target  string `json:"target,omitempty"`
	// PGRTT is the round-trip time added between the scenarios' pools and
	// PostgreSQL, by a proxy that forwards to PGAddr; "0s" adds none, and
	// the pools connect as the server was found.
	PGRTT  string `json:"pg_rtt"`
	PGAddr string `json:"pg_addr,omitempty"`
}

func (c config) forReport() reportConfig {
	return reportConfig{
		Command:         "go run ./examples/loadgen " + strings.Join(os.Args[1:], " "),
		Duration:        c.Duration.String(),
		Warmup:          c.Warmup.String(),
		Clients:         c.Clients,
		PoolSize:        c.PoolSize,
		Rounds:          c.Rounds,
		StormDuplicates: c.StormDuplicates,
		Scenarios:       c.Scenarios,
		Handler:         c.Handler,
		Target:          c.Target,
		PGRTT:           "0s",
	}
}

// summary is one scenario over all rounds.
type summary struct {
	Scenario  string  `json:"scenario"`
	About     string  `json:"about"`
	Reference string  `json:"reference"`
	Requests  int64   `json:"requests"`
	Errors    int64   `json:"errors"`
	PerSecond float64 `json:"requests_per_second"`
	// Ratio is PerSecond over the reference scenario's; RatioMin and
	// RatioMax are the extremes of the per-round ratios.
	Ratio    float64          `json:"ratio"`
	RatioMin float64          `json:"ratio_min"`
	RatioMax float64          `json:"ratio_max"`
	P50ms    float64          `json:"p50_ms"`
	P95ms    float64          `json:"p95_ms"`
	P99ms    float64          `json:"p99_ms"`
	Outcomes map[string]int64 `json:"outcomes"`
	// Per request, from the database counters; absent with -target.
	RoundTrips *float64 `json:"round_trips_per_request,omitempty"`
	Commits    *float64 `json:"commits_per_request,omitempty"`
	Statements *float64 `json:"statements_per_request,omitempty"`
	Rollbacks  *float64 `json:"rollbacks_per_request,omitempty"`
	// RoundTripsOverFloor is RoundTrips minus sql-floor's, when this run
	// counted sql-floor: what the scenario sends beyond BEGIN, the
	// handler's statements and one key row with COMMIT.
	RoundTripsOverFloor *float64 `json:"round_trips_over_floor,omitempty"`
	// CPU per request in microseconds: this process, and the rest of the
	// machine (PostgreSQL, and whatever else runs there).
	ProcessCPUus *float64 `json:"process_cpu_us_per_request,omitempty"`
	OtherCPUus   *float64 `json:"other_cpu_us_per_request,omitempty"`
	// Waits is the share of sampled backend time per state and wait event.
	Waits map[string]float64 `json:"pg_waits,omitempty"`

	rounds []*roundResult
}

func (rep *report) summarize(list []*scenario, results []*roundResult) {
	rep.Rounds = results
	byName := map[string]*summary{}
	for _, s := range list {
		sum := &summary{Scenario: s.name, About: s.about, Reference: s.reference, Outcomes: map[string]int64{}}
		var (
			seconds float64
			lat     []time.Duration
			c       counts
			counted = true
			waits   = map[string]int64{}
			cpu     cpuUse
			cpuOK   = true
		)
		for _, r := range results {
			if r.Scenario != s.name {
				continue
			}
			sum.rounds = append(sum.rounds, r)
			sum.Requests += r.Requests
			sum.Errors += r.Errors
			seconds += r.Seconds
			lat = append(lat, r.latencies...)
			for k, v := range r.Outcomes {
				sum.Outcomes[k] += v
			}
			if r.CPU == nil {
				cpuOK = false
			} else {
				cpu.Process += r.CPU.Process
				cpu.Machine += r.CPU.Machine
			}
			for k, v := range r.Waits {
				waits[k] += v
			}
			if r.Counts == nil {
				counted = false
				continue
			}
			c.RoundTrips += r.Counts.RoundTrips
			c.Commits += r.Counts.Commits
			c.Statements += r.Counts.Statements
			c.Rollbacks += r.Counts.Rollbacks
		}
		sum.PerSecond = float64(sum.Requests) / seconds
		sortDurations(lat)
		sum.P50ms = ms(percentile(lat, 50))
		sum.P95ms = ms(percentile(lat, 95))
		sum.P99ms = ms(percentile(lat, 99))
		if cpuOK && sum.Requests > 0 {
			n := float64(sum.Requests)
			sum.ProcessCPUus = ptr(cpu.Process / n * 1e6)
			sum.OtherCPUus = ptr((cpu.Machine - cpu.Process) / n * 1e6)
		}
		if counted && sum.Requests > 0 {
			n := float64(sum.Requests)
			sum.RoundTrips = ptr(float64(c.RoundTrips) / n)
			sum.Commits = ptr(float64(c.Commits) / n)
			sum.Statements = ptr(float64(c.Statements) / n)
			sum.Rollbacks = ptr(float64(c.Rollbacks) / n)
		}
		if len(waits) > 0 {
			var total int64
			for _, v := range waits {
				total += v
			}
			sum.Waits = map[string]float64{}
			for k, v := range waits {
				sum.Waits[k] = float64(v) / float64(total)
			}
		}
		byName[s.name] = sum
		rep.Scenarios = append(rep.Scenarios, sum)
	}
	if floor := byName["sql-floor"]; floor != nil && floor.RoundTrips != nil {
		for _, sum := range rep.Scenarios {
			if sum.RoundTrips != nil {
				sum.RoundTripsOverFloor = ptr(*sum.RoundTrips - *floor.RoundTrips)
			}
		}
	}
	for _, sum := range rep.Scenarios {
		ref, ok := byName[sum.Reference]
		if !ok {
			continue
		}
		sum.Ratio = sum.PerSecond / ref.PerSecond
		if lo, hi := roundRatios(sum, ref); lo != nil {
			sum.RatioMin, sum.RatioMax = *lo, *hi
		}
	}
	rep.Targets = targets(byName, rep.Config)
}

// replotScenarios reads the JSON of a run of the scenarios (one -pg-rtt or
// several) and writes its outputs again as cfg asks, with the targets of
// this version of the loadgen computed from the rounds it holds.
func replotScenarios(cfg config, path string, stdout io.Writer) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var multi struct {
		Latencies []*report `json:"latencies"`
	}
	reps := multi.Latencies
	if err := json.Unmarshal(b, &multi); err == nil && len(multi.Latencies) > 0 {
		reps = multi.Latencies
	} else {
		var one report
		if err := json.Unmarshal(b, &one); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		reps = []*report{&one}
	}
	for _, rep := range reps {
		by := map[string]*summary{}
		for _, s := range rep.Scenarios {
			by[s.Scenario] = s
		}
		for _, r := range rep.Rounds {
			if s := by[r.Scenario]; s != nil {
				s.rounds = append(s.rounds, r)
			}
		}
		if len(by) == 0 {
			return fmt.Errorf("%s holds no scenario", path)
		}
		rep.Targets = targets(by, rep.Config)
	}
	return writeOutputs(cfg, reps, stdout)
}

func ptr(f float64) *float64 { return &f }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// target is one of the goals the report checks.
type target struct {
	Goal string `json:"goal"`
	// Numerator and Denominator name the scenarios of a throughput ratio.
	Numerator   string   `json:"numerator,omitempty"`
	Denominator string   `json:"denominator,omitempty"`
	Measured    *float64 `json:"measured,omitempty"`
	// RoundsMin and RoundsMax are the extremes of a throughput ratio
	// computed round by round.
	RoundsMin *float64 `json:"rounds_min,omitempty"`
	RoundsMax *float64 `json:"rounds_max,omitempty"`
	Want      string   `json:"want"`
	Met       *bool    `json:"met,omitempty"`
	Note      string   `json:"note,omitempty"`
}

// roundRatios returns the extremes of a's throughput over b's, round by
// round.
func roundRatios(a, b *summary) (lo, hi *float64) {
	for i, r := range a.rounds {
		if i >= len(b.rounds) {
			break
		}
		x := r.throughput() / b.rounds[i].throughput()
		if lo == nil || x < *lo {
			lo = ptr(x)
		}
		if hi == nil || x > *hi {
			hi = ptr(x)
		}
	}
	return lo, hi
}

// targets are the goals of idem's performance. On loopback the machine is
// bound by CPU, and throughput follows CPU per request; at a millisecond of
// round trip (measured with 8 clients) it is bound by latency, where round
// trips and commits count and idem must cost next to nothing. The claim is
// measured against the floor of a row per key with the same round trips
// (sql-floor), atomic mode and optimistic mode alike; against baseline, a
// handler that does more work (-handler ledger) leaves idem a smaller
// share.
func targets(by map[string]*summary, cfg reportConfig) []target {
	const countedGoal = "replay throughput ÷ replay-uncounted (counting replays costs at most 2 %)"
	rtt, _ := time.ParseDuration(cfg.PGRTT)
	var out []target
	ratio := func(goal, a, b string, min float64) {
		t := target{Goal: goal, Numerator: a, Denominator: b, Want: fmt.Sprintf("≥ %.2f", min)}
		sa, oka := by[a]
		sb, okb := by[b]
		switch {
		case !oka || !okb:
			t.Note = "not measured in this run"
		default:
			t.Measured = ptr(sa.PerSecond / sb.PerSecond)
			t.RoundsMin, t.RoundsMax = roundRatios(sa, sb)
			t.Met = new(*t.Measured >= min)
		}
		out = append(out, t)
	}
	extra := func(goal, scenario string, get func(*summary) *float64) {
		t := target{Goal: goal, Want: "= 0"}
		a, b := by[scenario], by["baseline"]
		switch {
		case a == nil || b == nil:
			t.Note = "not measured in this run"
		case get(a) == nil || get(b) == nil:
			t.Note = "not counted (-target)"
		default:
			t.Measured = ptr(*get(a) - *get(b))
			// Counting is exact per request; allow only for rounding.
			t.Met = new(*t.Measured < 0.005 && *t.Measured > -0.005)
		}
		out = append(out, t)
	}
	extra("extra round trips per first execution (atomic − baseline)", "atomic", func(s *summary) *float64 { return s.RoundTrips })
	extra("extra commits per first execution (atomic − baseline)", "atomic", func(s *summary) *float64 { return s.Commits })
	if by["auto"] != nil {
		extra("extra round trips per first execution (auto − baseline)", "auto", func(s *summary) *float64 { return s.RoundTrips })
		extra("extra commits per first execution (auto − baseline)", "auto", func(s *summary) *float64 { return s.Commits })
	}
	if rtt >= time.Millisecond {
		ratio("auto throughput ÷ baseline (first attempts)", "auto", "baseline", 0.95)
		ratio("auto-replay throughput ÷ baseline (retries)", "auto-replay", "baseline", 1.5)
		ratio("atomic throughput ÷ baseline", "atomic", "baseline", 0.95)
		ratio("optimistic throughput ÷ baseline", "optimistic", "baseline", 0.95)
		ratio("replay throughput ÷ baseline", "replay", "baseline", 1.5)
		ratio(countedGoal, "replay", "replay-uncounted", 0.98)
		ratio("atomic throughput ÷ naive", "atomic", "naive", 1.5)
		ratio("atomic throughput ÷ leased", "atomic", "leased", 1.5)
		return out
	}
	first := 0.75
	if cfg.Handler == "ledger" {
		first = 0.85
	}
	ratio("atomic throughput ÷ baseline", "atomic", "baseline", first)
	ratio("optimistic throughput ÷ baseline", "optimistic", "baseline", first)
	// Auto mode's first attempts are optimistic mode's, its retries
	// atomic mode's: its own goals.
	auto := 0.75
	if cfg.Handler == "ledger" {
		auto = 0.80
	}
	ratio("auto throughput ÷ baseline (first attempts)", "auto", "baseline", auto)
	ratio("auto-replay throughput ÷ baseline (retries)", "auto-replay", "baseline", 2.0)
	ratio("auto-storm throughput ÷ baseline (8 first attempts per key)", "auto-storm", "baseline", 0.80)
	ratio("replay throughput ÷ baseline", "replay", "baseline", 1.5)
	ratio(countedGoal, "replay", "replay-uncounted", 0.98)
	ratio("atomic throughput ÷ leased", "atomic", "leased", 1.3)
	ratio("atomic throughput ÷ naive", "atomic", "naive", 1.25)
	ratio("sql-atomic ÷ sql-floor (the claim against a key row with the same round trips, no gRPC)", "sql-atomic", "sql-floor", 0.92)
	// sql-optimistic is also what auto mode's first attempts send (whose
	// own goal, 0.90, this one's is above).
	ratio("sql-optimistic ÷ sql-floor (auto mode's first attempts too)", "sql-optimistic", "sql-floor", 0.92)
	t := target{Goal: "yardstick: sql-floor ÷ sql-baseline (one key row, no claim)", Want: "reference"}
	if a, b := by["sql-floor"], by["sql-baseline"]; a != nil && b != nil {
		t.Measured = ptr(a.PerSecond / b.PerSecond)
	} else {
		t.Note = "not measured in this run"
	}
	out = append(out, t)
	return out
}

// machine describes where the run happened.
type machine struct {
	CPUs       int               `json:"cpus"`
	GOMAXPROCS int               `json:"gomaxprocs"`
	CPUModel   string            `json:"cpu_model"`
	Memory     string            `json:"memory"`
	Kernel     string            `json:"kernel"`
	Go         string            `json:"go"`
	PostgreSQL string            `json:"postgresql,omitempty"`
	Settings   map[string]string `json:"postgresql_settings,omitempty"`
}

func describeMachine(ctx context.Context, pg *pgtest.Server) machine {
	m := machine{
		CPUs:       runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		CPUModel:   procField("/proc/cpuinfo", "model name"),
		Memory:     memory(procField("/proc/meminfo", "MemTotal")),
		Go:         runtime.Version(),
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = runtime.GOOS + " " + strings.TrimSpace(string(b))
	}
	if pg == nil {
		return m
	}
	conn, err := pgx.Connect(ctx, pg.ConnString())
	if err != nil {
		return m
	}
	defer func() { _ = conn.Close(ctx) }()
	_ = conn.QueryRow(ctx, "SELECT version()").Scan(&m.PostgreSQL)
	m.Settings = map[string]string{}
	for _, name := range []string{"fsync", "synchronous_commit", "wal_sync_method", "full_page_writes", "shared_buffers", "max_connections", "commit_delay"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err == nil {
			m.Settings[name] = v
		}
	}
	return m
}

// memory turns /proc/meminfo's "24683656 kB" into "23.5 GiB".
func memory(s string) string {
	var kb int64
	if _, err := fmt.Sscanf(s, "%d kB", &kb); err != nil {
		return s
	}
	return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
}

func procField(path, field string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == field {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// writeOutputs writes the markdown report to stdout and the files cfg
// names. For one round-trip time it is that report; for several, the
// markdown and the chart set them side by side and the JSON holds
// [rttReports].
func writeOutputs(cfg config, reps []*report, stdout io.Writer) error {
	if len(reps) == 1 {
		return emit(cfg, stdout, reps[0].markdown, reps[0], reps[0].svg)
	}
	multi := newRTTReports(reps)
	return emit(cfg, stdout, multi.markdown, multi, func(w io.Writer) { svgByRTT(w, reps) })
}

// emit writes a report's markdown to stdout and, as cfg asks, to a file,
// with doc as JSON and the chart svg draws (none when svg is nil).
func emit(cfg config, stdout io.Writer, markdown func(io.Writer), doc any, svg func(io.Writer)) error {
	var md strings.Builder
	markdown(&md)
	if _, err := io.WriteString(stdout, md.String()); err != nil {
		return err
	}
	if cfg.MarkdownPath != "" {
		if err := os.WriteFile(cfg.MarkdownPath, []byte(md.String()), 0o644); err != nil {
			return err
		}
	}
	if cfg.JSONPath != "" {
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.JSONPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if cfg.SVGPath != "" && svg != nil {
		var out strings.Builder
		svg(&out)
		if err := os.WriteFile(cfg.SVGPath, []byte(out.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// rttReports is a run at several round-trip times: the key ratios at each,
// then each one's whole report.
type rttReports struct {
	Ratios    []rttRatios `json:"ratios_by_rtt"`
	Latencies []*report   `json:"latencies"`
}

// rttRatios is what one round-trip time did to the figures that matter.
type rttRatios struct {
	PGRTT     string             `json:"pg_rtt"`
	PingP50ms *float64           `json:"ping_p50_ms,omitempty"`
	PerSecond map[string]float64 `json:"requests_per_second"`
	// Targets are the throughput ratios of [keyRatios], measured at this
	// round-trip time.
	Targets []target `json:"targets"`
}

// keyRatios are the throughput ratios compared across round-trip times.
var keyRatios = [][2]string{{"atomic", "baseline"}, {"auto", "baseline"}, {"replay", "baseline"}, {"auto-replay", "baseline"}, {"atomic", "naive"}, {"atomic", "leased"}}

func newRTTReports(reps []*report) *rttReports {
	out := &rttReports{Latencies: reps}
	for _, rep := range reps {
		r := rttRatios{PGRTT: rep.Config.PGRTT, PingP50ms: rep.PingP50ms, PerSecond: map[string]float64{}}
		for _, s := range rep.Scenarios {
			r.PerSecond[s.Scenario] = s.PerSecond
		}
		for _, k := range keyRatios {
			if t := rep.target(k[0], k[1]); t != nil {
				r.Targets = append(r.Targets, *t)
			}
		}
		out.Ratios = append(out.Ratios, r)
	}
	return out
}

// target returns the throughput target a ÷ b, or nil.
func (rep *report) target(a, b string) *target {
	for i, t := range rep.Targets {
		if t.Numerator == a && t.Denominator == b {
			return &rep.Targets[i]
		}
	}
	return nil
}

// rtt is the report's round-trip time.
func (rep *report) rtt() time.Duration {
	d, _ := time.ParseDuration(rep.Config.PGRTT)
	return d
}

func (rep *report) markdown(w io.Writer) {
	rep.markdownHeader(w, "")
	if rep.Config.Target == "" {
		fmt.Fprintf(w, "Round trip to PostgreSQL: %s.\n", rep.rttSentence())
	}
	fmt.Fprintln(w)
	rep.markdownTables(w)
}

// rttSentence says how the pools reached PostgreSQL, and how long an empty
// query took.
func (rep *report) rttSentence() string {
	var s string
	if rtt := rep.rtt(); rtt == 0 {
		s = "no delay added (`-pg-rtt 0`), the pools connect as the server was found"
	} else {
		s = fmt.Sprintf("%v added (`-pg-rtt`) by a proxy that delays each direction by half, on its way to %s", rtt, rep.Config.PGAddr)
	}
	if rep.PingP50ms != nil {
		s += fmt.Sprintf("; an empty query took %.3f ms (p50)", *rep.PingP50ms)
	}
	return s
}

// markdownHeader writes the command, the load, and the machine; also, in
// its own sentence, what.
func (rep *report) markdownHeader(w io.Writer, also string) {
	c, m := rep.Config, rep.Machine
	fmt.Fprintf(w, "Command: `%s`\n\n", c.Command)
	fmt.Fprintf(w, "%d clients, pool of %d connections, %s measured per scenario and round after %s of warm-up, %d round(s) in rotating order.%s\n\n",
		c.Clients, c.PoolSize, c.Duration, c.Warmup, c.Rounds, also)
	if h, err := lookupHandler(c.Handler); err == nil {
		fmt.Fprintf(w, "Handler (`-handler %s`): %s.\n\n", h.name, h.about)
	}
	fmt.Fprintf(w, "Machine: %d CPUs (%s), %s memory, %s, %s (GOMAXPROCS %d).\n", m.CPUs, m.CPUModel, m.Memory, m.Kernel, m.Go, m.GOMAXPROCS)
	if m.PostgreSQL != "" {
		keys := make([]string, 0, len(m.Settings))
		for k := range m.Settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var s []string
		for _, k := range keys {
			s = append(s, k+"="+m.Settings[k])
		}
		fmt.Fprintf(w, "PostgreSQL: %s; %s.\n", m.PostgreSQL, strings.Join(s, ", "))
	}
}

// markdown writes the key ratios at each round-trip time, then each
// round-trip time's tables.
func (r *rttReports) markdown(w io.Writer) {
	first := r.Latencies[0]
	first.markdownHeader(w, fmt.Sprintf(" All of it at each of %d round-trip times to PostgreSQL (`-pg-rtt`), in turn; ratios divide throughputs measured at the same one.", len(r.Latencies)))
	fmt.Fprintln(w)
	var head, align strings.Builder
	head.WriteString("| round trip | empty query p50 ms | baseline req/s | atomic req/s |")
	align.WriteString("|---|---:|---:|---:|")
	for _, k := range keyRatios {
		fmt.Fprintf(&head, " %s ÷ %s |", k[0], k[1])
		align.WriteString("---:|")
	}
	fmt.Fprintln(w, head.String())
	fmt.Fprintln(w, align.String())
	for i, rep := range r.Latencies {
		rr := r.Ratios[i]
		row := []string{rttLabel(rep.rtt()), perReq(rep.PingP50ms), rate(rr.PerSecond, "baseline"), rate(rr.PerSecond, "atomic")}
		for _, k := range keyRatios {
			cell := "—"
			if t := rep.target(k[0], k[1]); t != nil && t.Measured != nil {
				cell = rep.measured(t)
			}
			row = append(row, cell)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	for _, rep := range r.Latencies {
		fmt.Fprintf(w, "\n**Round trip %s**: %s.\n\n", rttLabel(rep.rtt()), rep.rttSentence())
		rep.markdownTables(w)
	}
}

func rate(perSecond map[string]float64, name string) string {
	v, ok := perSecond[name]
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%.0f", v)
}

// measured formats a target's measurement, with the extremes of its rounds
// when there were several.
func (rep *report) measured(t *target) string {
	s := fmt.Sprintf("%.2f", *t.Measured)
	if t.RoundsMin != nil && rep.Config.Rounds > 1 {
		s += fmt.Sprintf(" (%.2f–%.2f)", *t.RoundsMin, *t.RoundsMax)
	}
	return s
}

// markdownTables writes the scenarios, the targets and the waits.
func (rep *report) markdownTables(w io.Writer) {
	fmt.Fprintln(w, "| scenario | req/s | × ref (rounds) | p50 ms | p95 ms | p99 ms | round trips/req | round trips − sql-floor | commits/req | statements/req | CPU µs/req loadgen + rest | outcomes | errors |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
	floor := false
	for _, s := range rep.Scenarios {
		ratio := fmt.Sprintf("%.2f", s.Ratio)
		if len(s.rounds) > 1 {
			ratio += fmt.Sprintf(" (%.2f–%.2f)", s.RatioMin, s.RatioMax)
		}
		if s.Reference != "baseline" {
			ratio += " ÷ " + s.Reference
		}
		cpu := "—"
		if s.ProcessCPUus != nil {
			cpu = fmt.Sprintf("%.0f + %.0f", *s.ProcessCPUus, *s.OtherCPUus)
		}
		overFloor := "—"
		if d := s.RoundTripsOverFloor; d != nil {
			floor = true
			overFloor = fmt.Sprintf("%+.2f", *d)
			if *d < 0.005 && *d > -0.005 {
				overFloor = "0.00"
			}
		}
		fmt.Fprintf(w, "| %s | %.0f | %s | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %d |\n",
			s.Scenario, s.PerSecond, ratio, s.P50ms, s.P95ms, s.P99ms,
			perReq(s.RoundTrips), overFloor, perReq(s.Commits), perReq(s.Statements), cpu, outcomes(s.Outcomes), s.Errors)
	}
	fmt.Fprintln(w)
	if floor {
		fmt.Fprintln(w, "Round trips − sql-floor: a scenario's round trips per request minus those of sql-floor, measured in this run: BEGIN, the handler's statements, and one key row pipelined with COMMIT, no claim.")
	} else if rep.Config.Target == "" {
		fmt.Fprintln(w, "Round trips − sql-floor: not measured in this run (add sql-floor to -scenarios).")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | want | measured | met |")
	fmt.Fprintln(w, "|---|---|---:|---|")
	for _, t := range rep.Targets {
		measured, met := "—", "—"
		if t.Measured != nil {
			measured = rep.measured(&t)
		}
		if t.Met != nil {
			met = map[bool]string{true: "yes", false: "**no**"}[*t.Met]
		}
		if t.Note != "" {
			met = t.Note
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", t.Goal, t.Want, measured, met)
	}
	var waits []*summary
	for _, s := range rep.Scenarios {
		if len(s.Waits) > 0 {
			waits = append(waits, s)
		}
	}
	if len(waits) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Where the scenario's PostgreSQL backends were, sampled every 10 ms (share of samples, top 6):")
		fmt.Fprintln(w)
		for _, s := range waits {
			type kv struct {
				k string
				v float64
			}
			var l []kv
			for k, v := range s.Waits {
				l = append(l, kv{k, v})
			}
			slices.SortFunc(l, func(a, b kv) int {
				if a.v != b.v {
					if a.v > b.v {
						return -1
					}
					return 1
				}
				return strings.Compare(a.k, b.k)
			})
			var parts []string
			for i, e := range l {
				if i == 6 {
					break
				}
				parts = append(parts, fmt.Sprintf("%s %.0f%%", e.k, 100*e.v))
			}
			fmt.Fprintf(w, "- %s: %s\n", s.Scenario, strings.Join(parts, ", "))
		}
	}
}

func perReq(f *float64) string {
	if f == nil {
		return "—"
	}
	return fmt.Sprintf("%.2f", *f)
}

func outcomes(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
