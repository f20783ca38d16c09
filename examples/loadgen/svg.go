package main

import (
	"fmt"
	"html"
	"io"
	"strings"
)

// svg draws two bar charts side by side: throughput per scenario, with its
// ratio to the reference, and p99 latency.
func (rep *report) svg(w io.Writer) {
	const (
		rowH   = 26
		top    = 64
		labelW = 110
		barW   = 250
		gap    = 60
		panelW = labelW + barW + gap
		width  = 2 * panelW
	)
	derived := rep.derivedRatios()
	height := top + rowH*len(rep.Scenarios) + 40
	if derived != "" {
		height += 18
	}
	var maxRate, maxP99 float64
	for _, s := range rep.Scenarios {
		maxRate = max(maxRate, s.PerSecond)
		maxP99 = max(maxP99, s.P99ms)
	}
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="#fff"/>`+"\n")
	c, m := rep.Config, rep.Machine
	title := fmt.Sprintf("idem loadgen: %d clients, %s × %d round(s) per scenario", c.Clients, c.Duration, c.Rounds)
	if c.Target == "" {
		title += ", round trip to PostgreSQL: " + rttLabel(rep.rtt())
	}
	fmt.Fprintf(w, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	fmt.Fprintf(w, `<text x="10" y="38" fill="#555">%s</text>`+"\n", html.EscapeString(m.caption()))
	fmt.Fprintf(w, `<text x="%d" y="%d" font-weight="bold">throughput (req/s, × reference)</text>`+"\n", labelW, top-8)
	fmt.Fprintf(w, `<text x="%d" y="%d" font-weight="bold">p99 latency (ms)</text>`+"\n", panelW+labelW, top-8)
	for i, s := range rep.Scenarios {
		y := top + i*rowH
		color := s.color()
		for p, v := range []struct {
			value, max float64
			label      string
		}{
			{s.PerSecond, maxRate, fmt.Sprintf("%.0f  (%.2f×)", s.PerSecond, s.Ratio)},
			{s.P99ms, maxP99, fmt.Sprintf("%.1f", s.P99ms)},
		} {
			x := p * panelW
			bw := 0.0
			if v.max > 0 {
				bw = float64(barW) * v.value / v.max
			}
			fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", x+labelW-8, y+15, html.EscapeString(s.Scenario))
			fmt.Fprintf(w, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x+labelW, y+3, bw, rowH-8, color)
			fmt.Fprintf(w, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(x+labelW)+bw+4, y+15, html.EscapeString(v.label))
		}
	}
	if derived != "" {
		fmt.Fprintf(w, `<text x="10" y="%d">%s</text>`+"\n", height-32, html.EscapeString(derived))
	}
	fmt.Fprintf(w, `<text x="10" y="%d" fill="#555">× reference: sql-* ÷ sql-baseline (no gRPC), the rest ÷ baseline (same handler without idem), measured in the same run.</text>`+"\n", height-14)
	fmt.Fprintln(w, `</svg>`)
}

// svgByRTT draws the throughput of each report's scenarios in a panel per
// round-trip time, side by side on one scale, with each bar's ratio to its
// reference at that round-trip time.
func svgByRTT(w io.Writer, reps []*report) {
	const (
		rowH   = 26
		top    = 64
		labelW = 100
		barW   = 190
		gap    = 70
		panelW = labelW + barW + gap
	)
	width := max(panelW*len(reps), 760)
	rows := 0
	var maxRate float64
	var derived []string
	for _, rep := range reps {
		rows = max(rows, len(rep.Scenarios))
		for _, s := range rep.Scenarios {
			maxRate = max(maxRate, s.PerSecond)
		}
		if d := rep.derivedRatios(); d != "" {
			derived = append(derived, rttLabel(rep.rtt())+": "+d)
		}
	}
	height := top + rowH*rows + 40 + 18*len(derived)
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="#fff"/>`+"\n")
	c := reps[0].Config
	labels := make([]string, len(reps))
	for i, rep := range reps {
		labels[i] = rttLabel(rep.rtt())
	}
	title := fmt.Sprintf("idem loadgen: %d clients, %s × %d round(s) per scenario, round trip to PostgreSQL: %s",
		c.Clients, c.Duration, c.Rounds, strings.Join(labels, ", "))
	fmt.Fprintf(w, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	fmt.Fprintf(w, `<text x="10" y="38" fill="#555">%s</text>`+"\n", html.EscapeString(reps[0].Machine.caption()))
	for p, rep := range reps {
		x := p * panelW
		head := "req/s at " + labels[p]
		if rep.rtt() > 0 {
			head += " round trip"
		}
		fmt.Fprintf(w, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x+labelW, top-8, html.EscapeString(head))
		for i, s := range rep.Scenarios {
			y := top + i*rowH
			bw := 0.0
			if maxRate > 0 {
				bw = float64(barW) * s.PerSecond / maxRate
			}
			fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", x+labelW-8, y+15, html.EscapeString(s.Scenario))
			fmt.Fprintf(w, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x+labelW, y+3, bw, rowH-8, s.color())
			fmt.Fprintf(w, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(x+labelW)+bw+4, y+15, html.EscapeString(fmt.Sprintf("%.0f (%.2f×)", s.PerSecond, s.Ratio)))
		}
	}
	for i, d := range derived {
		fmt.Fprintf(w, `<text x="10" y="%d">%s</text>`+"\n", height-32-18*(len(derived)-1-i), html.EscapeString(d))
	}
	fmt.Fprintf(w, `<text x="10" y="%d" fill="#555">× reference at the same round trip: sql-* ÷ sql-baseline (no gRPC), the rest ÷ baseline (same handler without idem).</text>`+"\n", height-14)
	fmt.Fprintln(w, `</svg>`)
}

// color is the colour of s's bars: grey for a reference, purple for the
// SQL-only yardsticks, orange for the alternatives to atomic mode.
func (s *summary) color() string {
	switch {
	case s.Scenario == s.Reference:
		return "#888"
	case strings.HasPrefix(s.Scenario, "sql-"):
		return "#8a6fb0"
	case s.Scenario == "naive" || s.Scenario == "leased":
		return "#c07a3a"
	}
	return "#4878a8"
}

// caption describes the machine in one line.
func (m machine) caption() string {
	return fmt.Sprintf("%d CPUs %s · %s · fsync=%s synchronous_commit=%s",
		m.CPUs, m.CPUModel, shortVersion(m.PostgreSQL), m.Settings["fsync"], m.Settings["synchronous_commit"])
}

// derivedRatios describes the throughput targets between two scenarios
// that the bars' ratios to the reference do not show, e.g.
// "atomic ÷ leased 1.42 (want ≥ 1.30, met)".
func (rep *report) derivedRatios() string {
	var parts []string
	for _, t := range rep.Targets {
		if t.Denominator == "" || t.Denominator == "baseline" || t.Measured == nil || t.Met == nil {
			continue
		}
		met := map[bool]string{true: "met", false: "missed"}[*t.Met]
		parts = append(parts, fmt.Sprintf("%s ÷ %s %.2f (want %s, %s)", t.Numerator, t.Denominator, *t.Measured, t.Want, met))
	}
	return strings.Join(parts, " · ")
}

// shortVersion returns "PostgreSQL 15.4" from version().
func shortVersion(v string) string {
	var name, num string
	if _, err := fmt.Sscanf(v, "%s %s", &name, &num); err != nil {
		return v
	}
	return name + " " + num
}
