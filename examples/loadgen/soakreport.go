package main

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"os"
	"strings"
	"time"
)

// soakMinute is the samples of one minute taken together: the latency
// percentiles are those of the minute's calls, the table's figures the
// extremes of its samples.
type soakMinute struct {
	Minute      int     `json:"minute"`
	Seconds     float64 `json:"seconds"`
	Executed    int64   `json:"executed"`
	Replayed    int64   `json:"replayed"`
	Errors      int64   `json:"errors"`
	PerSecond   float64 `json:"requests_per_second"`
	P50ms       float64 `json:"p50_ms"`
	P99ms       float64 `json:"p99_ms"`
	RowsMin     int64   `json:"rows_min"`
	RowsMax     int64   `json:"rows_max"`
	BytesMax    int64   `json:"total_bytes_max"`
	DeadMax     int64   `json:"n_dead_tup_max"`
	Swept       int64   `json:"swept"`
	SweepSecs   float64 `json:"sweep_seconds"`
	Autovacuums int64   `json:"autovacuum_count"`
	MachineCPU  float64 `json:"machine_cpu_share"`
	Load1Max    float64 `json:"load_average_1m_max"`
}

// perMinute groups samples by the minute their interval's middle falls
// in (the ticker's slight lateness leaves the interval that ends at 60 s
// in the first minute).
func perMinute(samples []*soakSample) []soakMinute {
	var out []soakMinute
	var lat []time.Duration
	flush := func() {
		if len(out) == 0 {
			return
		}
		m := &out[len(out)-1]
		sortDurations(lat)
		m.P50ms, m.P99ms = ms(percentile(lat, 50)), ms(percentile(lat, 99))
		if m.Seconds > 0 {
			m.PerSecond = float64(m.Executed+m.Replayed) / m.Seconds
			m.MachineCPU /= m.Seconds
		}
		lat = lat[:0]
	}
	for _, s := range samples {
		minute := int((s.Elapsed - s.Seconds/2) / 60)
		if len(out) == 0 || out[len(out)-1].Minute != minute {
			flush()
			out = append(out, soakMinute{Minute: minute, RowsMin: s.Rows})
		}
		m := &out[len(out)-1]
		m.Seconds += s.Seconds
		m.Executed += s.Executed
		m.Replayed += s.Replayed
		m.Errors += s.Errors
		m.RowsMin = min(m.RowsMin, s.Rows)
		m.RowsMax = max(m.RowsMax, s.Rows)
		m.BytesMax = max(m.BytesMax, s.TotalBytes)
		m.DeadMax = max(m.DeadMax, s.DeadTuples)
		m.Swept += s.Swept
		m.SweepSecs += s.SweepSeconds
		m.Autovacuums = s.Autovacuums
		m.MachineCPU += s.MachineCPU * s.Seconds
		m.Load1Max = max(m.Load1Max, s.Load1)
		lat = append(lat, s.latencies...)
	}
	flush()
	return out
}

// soakSummary is what the soak shows: whether the key table stayed
// bounded once keys began to expire, and whether throughput and latency
// stayed flat.
type soakSummary struct {
	Keys     int64   `json:"keys"`
	Replayed int64   `json:"replayed"`
	Errors   int64   `json:"errors"`
	Seconds  float64 `json:"seconds"`
	// SteadyFrom is when the table should have stopped growing: the first
	// keys have expired and a sweep has run (TTL plus the sweep interval).
	SteadyFrom float64 `json:"steady_from_s"`
	// Over the samples from SteadyFrom on.
	RowsMin       int64   `json:"rows_min"`
	RowsMax       int64   `json:"rows_max"`
	UnexpiredMin  int64   `json:"unexpired_rows_min"`
	UnexpiredMax  int64   `json:"unexpired_rows_max"`
	HeapBytesMin  int64   `json:"heap_bytes_min"`
	HeapBytesMax  int64   `json:"heap_bytes_max"`
	IndexBytesMin int64   `json:"index_bytes_min"`
	IndexBytesMax int64   `json:"index_bytes_max"`
	TotalBytesMin int64   `json:"total_bytes_min"`
	TotalBytesMax int64   `json:"total_bytes_max"`
	DeadMax       int64   `json:"n_dead_tup_max"`
	KeysPerSecond float64 `json:"keys_per_second"`
	// SweptPerSecond is the sweeper's deletions per second of run time;
	// SweepRate its deletions per second of sweeping, what it can delete
	// at these settings while the load runs; SweepBusy the share of the
	// time it was sweeping.
	SweptPerSecond float64 `json:"swept_per_second"`
	SweepRate      float64 `json:"sweep_rows_per_busy_second"`
	SweepBusy      float64 `json:"sweep_busy_share"`
	// BytesPerUnexpiredRow is TotalBytesMax over UnexpiredMax: the disk a
	// key kept for the TTL takes at steady state, expired rows awaiting
	// the sweeper and free space included.
	BytesPerUnexpiredRow float64     `json:"total_bytes_per_unexpired_row"`
	Autovacuums          int64       `json:"autovacuum_count"`
	FirstMinute          *soakMinute `json:"first_minute,omitempty"`
	LastMinute           *soakMinute `json:"last_minute,omitempty"`
	FirstError           string      `json:"first_error,omitempty"`
	SweepError           string      `json:"sweep_error,omitempty"`
}

func summarizeSoak(samples []*soakSample, minutes []soakMinute, sc soakConfig) soakSummary {
	sum := soakSummary{SteadyFrom: (sc.TTL + sc.SweepInterval).Seconds()}
	var steadySeconds, swept, busy float64
	var keys0 int64 = -1
	steady := 0
	for _, s := range samples {
		sum.Replayed += s.Replayed
		sum.Errors += s.Errors
		sum.Seconds += s.Seconds
		sum.Keys = s.Keys
		sum.Autovacuums = s.Autovacuums
		if s.Elapsed-s.Seconds < sum.SteadyFrom {
			keys0 = s.Keys
			continue
		}
		if steady == 0 {
			sum.RowsMin, sum.UnexpiredMin = s.Rows, s.Unexpired
			sum.HeapBytesMin, sum.IndexBytesMin, sum.TotalBytesMin = s.HeapBytes, s.IndexBytes, s.TotalBytes
		}
		steady++
		sum.RowsMin, sum.RowsMax = min(sum.RowsMin, s.Rows), max(sum.RowsMax, s.Rows)
		sum.UnexpiredMin, sum.UnexpiredMax = min(sum.UnexpiredMin, s.Unexpired), max(sum.UnexpiredMax, s.Unexpired)
		sum.HeapBytesMin, sum.HeapBytesMax = min(sum.HeapBytesMin, s.HeapBytes), max(sum.HeapBytesMax, s.HeapBytes)
		sum.IndexBytesMin, sum.IndexBytesMax = min(sum.IndexBytesMin, s.IndexBytes), max(sum.IndexBytesMax, s.IndexBytes)
		sum.TotalBytesMin, sum.TotalBytesMax = min(sum.TotalBytesMin, s.TotalBytes), max(sum.TotalBytesMax, s.TotalBytes)
		sum.DeadMax = max(sum.DeadMax, s.DeadTuples)
		steadySeconds += s.Seconds
		swept += float64(s.Swept)
		busy += s.SweepSeconds
	}
	if steadySeconds > 0 {
		if keys0 < 0 {
			keys0 = 0
		}
		sum.KeysPerSecond = float64(sum.Keys-keys0) / steadySeconds
		sum.SweptPerSecond = swept / steadySeconds
		sum.SweepBusy = busy / steadySeconds
	}
	if busy > 0 {
		sum.SweepRate = swept / busy
	}
	if sum.UnexpiredMax > 0 {
		sum.BytesPerUnexpiredRow = float64(sum.TotalBytesMax) / float64(sum.UnexpiredMax)
	}
	if len(minutes) > 0 {
		first, last := minutes[0], minutes[len(minutes)-1]
		sum.FirstMinute, sum.LastMinute = &first, &last
	}
	return sum
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// markdown writes the soak's figures and its table per minute.
func (rep *soakReport) markdown(w io.Writer) {
	c, s := rep.Config, rep.Summary
	truncate := ""
	if !c.VacuumTruncate {
		truncate = ", vacuum_truncate off"
	}
	fmt.Fprintf(w, "# Soak: %s, %d clients, TTL %s, sweep every %s (batch %d, pause %s)%s\n\n",
		c.Duration, c.Clients, c.TTL, c.SweepInterval, c.SweepBatch, c.SweepPause, truncate)
	fmt.Fprintf(w, "%s; autovacuum=%s, autovacuum_naptime=%s, autovacuum_vacuum_scale_factor=%s\n\n",
		rep.Machine.caption(), rep.Settings["autovacuum"], rep.Settings["autovacuum_naptime"], rep.Settings["autovacuum_vacuum_scale_factor"])
	fmt.Fprintf(w, "- keys executed: %d (%.0f/s at steady state), replayed: %d, errors: %d\n", s.Keys, s.KeysPerSecond, s.Replayed, s.Errors)
	fmt.Fprintf(w, "- from %.0f s on (TTL + sweep interval): rows %d–%d (unexpired %d–%d), heap %.1f–%.1f MiB, indexes %.1f–%.1f MiB, total %.1f–%.1f MiB (%.0f bytes per unexpired row), n_dead_tup at most %d\n",
		s.SteadyFrom, s.RowsMin, s.RowsMax, s.UnexpiredMin, s.UnexpiredMax, mib(s.HeapBytesMin), mib(s.HeapBytesMax),
		mib(s.IndexBytesMin), mib(s.IndexBytesMax), mib(s.TotalBytesMin), mib(s.TotalBytesMax), s.BytesPerUnexpiredRow, s.DeadMax)
	fmt.Fprintf(w, "- sweeper: %.0f rows/s deleted, busy %.1f%% of the time, %.0f rows per second of sweeping\n", s.SweptPerSecond, 100*s.SweepBusy, s.SweepRate)
	fmt.Fprintf(w, "- autovacuum runs on idempotency_keys: %d\n", s.Autovacuums)
	if s.FirstMinute != nil {
		fmt.Fprintf(w, "- first minute: %.0f req/s, p99 %.1f ms; last minute: %.0f req/s, p99 %.1f ms\n",
			s.FirstMinute.PerSecond, s.FirstMinute.P99ms, s.LastMinute.PerSecond, s.LastMinute.P99ms)
	}
	if s.FirstError != "" {
		fmt.Fprintf(w, "- first error: %s\n", s.FirstError)
	}
	if s.SweepError != "" {
		fmt.Fprintf(w, "- sweeper error: %s\n", s.SweepError)
	}
	fmt.Fprintln(w, "\n| minute | req/s | p50 ms | p99 ms | rows min–max | total MiB max | n_dead_tup max | swept | sweeping s | autovacuums | errors | machine CPU | load avg max |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, m := range rep.Minutes {
		fmt.Fprintf(w, "| %d | %.0f | %.2f | %.2f | %d–%d | %.1f | %d | %d | %.1f | %d | %d | %.0f%% | %.1f |\n",
			m.Minute+1, m.PerSecond, m.P50ms, m.P99ms, m.RowsMin, m.RowsMax, mib(m.BytesMax), m.DeadMax, m.Swept, m.SweepSecs, m.Autovacuums, m.Errors, 100*m.MachineCPU, m.Load1Max)
	}
}

// writeSoakOutputs writes the markdown to stdout and, as cfg asks, to a
// file, with the JSON and the chart.
func writeSoakOutputs(cfg config, rep *soakReport, stdout io.Writer) error {
	return emit(cfg, stdout, rep.markdown, rep, rep.svg)
}

// replotSoak reads a soak's JSON and writes its markdown and chart again
// as cfg asks, without running it again. The minutes' percentiles come
// from the JSON, since it does not keep every call's latency.
func replotSoak(cfg config, path string, stdout io.Writer) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	rep := new(soakReport)
	if err := json.Unmarshal(b, rep); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	cfg.JSONPath = ""
	return writeSoakOutputs(cfg, rep, stdout)
}

// series is one line of a panel.
type series struct {
	label string
	color string
	y     []float64
}

// svg draws the soak per sample, in panels one above the other on a shared
// time axis: throughput, latency, the key table's rows, its size on disk,
// and its dead tuples with the autovacuum runs.
func (rep *soakReport) svg(w io.Writer) {
	const (
		left   = 70
		plotW  = 640
		panelH = 110
		gap    = 44
		top    = 70
		width  = left + plotW + 150
	)
	var x, rate, p50, p99, rows, unexpired, total, heap, index, dead, machineCPU, processCPU []float64
	var vacuums []float64
	prevVac := int64(0)
	for _, s := range rep.Samples {
		x = append(x, s.Elapsed/60)
		rate = append(rate, s.PerSecond)
		p50 = append(p50, s.P50ms)
		p99 = append(p99, s.P99ms)
		rows = append(rows, float64(s.Rows)/1000)
		unexpired = append(unexpired, float64(s.Unexpired)/1000)
		total = append(total, mib(s.TotalBytes))
		heap = append(heap, mib(s.HeapBytes))
		index = append(index, mib(s.IndexBytes))
		dead = append(dead, float64(s.DeadTuples)/1000)
		machineCPU = append(machineCPU, 100*s.MachineCPU)
		processCPU = append(processCPU, 100*s.ProcessCPU)
		if s.Autovacuums > prevVac {
			vacuums = append(vacuums, s.Elapsed/60)
		}
		prevVac = s.Autovacuums
	}
	panels := []struct {
		title string
		lines []series
		ymax  float64 // fixed; 0: from the data
	}{
		{"requests per second (executed + replayed)", []series{{"req/s", "#4878a8", rate}}, 0},
		{"latency (ms)", []series{{"p99", "#c07a3a", p99}, {"p50", "#4878a8", p50}}, 0},
		{"idempotency_keys rows (thousands)", []series{{"rows", "#4878a8", rows}, {"unexpired", "#8a6fb0", unexpired}}, 0},
		{"idempotency_keys on disk (MiB)", []series{{"total", "#4878a8", total}, {"heap", "#8a6fb0", heap}, {"indexes", "#c07a3a", index}}, 0},
		{"dead tuples (thousands); ticks: autovacuum ran", []series{{"n_dead_tup", "#888", dead}}, 0},
		{"CPU busy (% of all cores): the machine, shared with anything else running, and this process", []series{{"machine", "#888", machineCPU}, {"loadgen", "#4878a8", processCPU}}, 100},
	}
	height := top + len(panels)*(panelH+gap) + 10
	xmax := 0.0
	if len(x) > 0 {
		xmax = x[len(x)-1]
	}
	c := rep.Config
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="#fff"/>`+"\n")
	title := fmt.Sprintf("idem soak: %s, %d clients, TTL %s, sweep every %s (batch %d, pause %s), per %s sample",
		c.Duration, c.Clients, c.TTL, c.SweepInterval, c.SweepBatch, c.SweepPause, c.Sample)
	fmt.Fprintf(w, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	fmt.Fprintf(w, `<text x="10" y="38" fill="#555">%s</text>`+"\n", html.EscapeString(rep.Machine.caption()+" · autovacuum="+rep.Settings["autovacuum"]+truncateLabel(c)))
	steadyX := rep.Summary.SteadyFrom / 60
	for i, p := range panels {
		y0 := top + i*(panelH+gap)
		ymax := 0.0
		for _, l := range p.lines {
			for _, v := range l.y {
				ymax = max(ymax, v)
			}
		}
		ymax = niceCeil(ymax)
		if p.ymax > 0 {
			ymax = p.ymax
		}
		px := func(v float64) float64 {
			if xmax == 0 {
				return left
			}
			return left + plotW*v/xmax
		}
		py := func(v float64) float64 {
			if ymax == 0 {
				return float64(y0 + panelH)
			}
			return float64(y0+panelH) - panelH*v/ymax
		}
		fmt.Fprintf(w, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", left, y0-8, html.EscapeString(p.title))
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", left, y0, plotW, panelH)
		fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-6, y0+10, fmtAxis(ymax))
		fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">0</text>`+"\n", left-6, y0+panelH)
		if steadyX > 0 && steadyX < xmax {
			fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ccc" stroke-dasharray="3,3"/>`+"\n", px(steadyX), y0, px(steadyX), y0+panelH)
		}
		for m := 1.0; m < xmax; m++ {
			fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", px(m), y0+1, px(m), y0+panelH-1)
		}
		for j, l := range p.lines {
			var pts []string
			for k, v := range l.y {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(x[k]), py(v)))
			}
			fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", l.color, strings.Join(pts, " "))
			fmt.Fprintf(w, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", left+plotW+8, y0+14+16*j, l.color, html.EscapeString(l.label))
		}
		if i == 4 {
			for _, v := range vacuums {
				fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#2a8a4a" stroke-width="2"/>`+"\n", px(v), y0+panelH, px(v), y0+panelH-12)
			}
		}
		for m := 0.0; m <= xmax; m++ {
			fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%.0f</text>`+"\n", px(m), y0+panelH+14, m)
		}
	}
	fmt.Fprintf(w, `<text x="%d" y="%d" fill="#555">minutes since the start; dashed: TTL + sweep interval, from which the table should stop growing</text>`+"\n", left, height-8)
	fmt.Fprintln(w, `</svg>`)
}

// truncateLabel names a soak run with vacuum_truncate off.
func truncateLabel(c soakReportConfig) string {
	if c.VacuumTruncate {
		return ""
	}
	return " · vacuum_truncate=off on idempotency_keys"
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 0
	}
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for p > v {
		p /= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func fmtAxis(v float64) string {
	if v >= 10 || v == 0 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
