package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestWindowTake(t *testing.T) {
	var w window
	for i := 1; i <= 100; i++ {
		o := executed
		if i%10 == 0 {
			o = replayed
		}
		w.add(time.Duration(i)*time.Millisecond, o)
	}
	w.fail(errors.New("first"))
	w.fail(errors.New("second"))
	s := w.take(2)
	if s.Executed != 90 || s.Replayed != 10 || s.Errors != 2 {
		t.Errorf("executed %d, replayed %d, errors %d; want 90, 10, 2", s.Executed, s.Replayed, s.Errors)
	}
	if s.PerSecond != 50 {
		t.Errorf("%v req/s, want 100 calls over 2 s = 50", s.PerSecond)
	}
	if s.P50ms != 51 || s.P99ms != 100 || s.MaxMs != 100 {
		t.Errorf("p50 %v, p99 %v, max %v ms; want 51, 100, 100", s.P50ms, s.P99ms, s.MaxMs)
	}
	if w.firstErr == nil || w.firstErr.Error() != "first" {
		t.Errorf("first error %v, want the first one kept", w.firstErr)
	}
	next := w.take(1)
	if next.Executed+next.Replayed+next.Errors != 0 || len(next.latencies) != 0 || next.P99ms != 0 {
		t.Errorf("the window was not emptied: %+v", next)
	}
}

// samples returns n samples of every seconds, each of rate calls per
// second that took lat, and a table of rows rows.
func samples(n int, every float64, rate int, lat time.Duration, rows func(i int) int64) []*soakSample {
	var out []*soakSample
	for i := range n {
		s := &soakSample{
			Elapsed:  every * float64(i+1),
			Seconds:  every,
			Executed: int64(rate) * int64(every),
			Keys:     int64(rate) * int64(every) * int64(i+1),
			Swept:    int64(rate) * int64(every),
		}
		s.Rows, s.Unexpired = rows(i), rows(i)/2
		s.TotalBytes = 100 * s.Rows
		s.DeadTuples = int64(i)
		s.Autovacuums = int64(i / 6)
		s.SweepSeconds = every / 10
		for range s.Executed {
			s.latencies = append(s.latencies, lat)
		}
		out = append(out, s)
	}
	return out
}

func TestPerMinute(t *testing.T) {
	ss := samples(15, 10, 10, time.Millisecond, func(i int) int64 { return int64(1000 + i) })
	// The second minute's last interval is slow.
	for j := range ss[11].latencies {
		ss[11].latencies[j] = time.Second
	}
	ms := perMinute(ss)
	if len(ms) != 3 {
		t.Fatalf("%d minutes from 150 s of samples, want 3 (the last one partial)", len(ms))
	}
	m0, m1, m2 := ms[0], ms[1], ms[2]
	if m0.Minute != 0 || m0.Seconds != 60 || m0.Executed != 600 || m0.PerSecond != 10 {
		t.Errorf("first minute %+v: want the samples ending at 10…60 s, 600 calls, 10/s", m0)
	}
	if m0.RowsMin != 1000 || m0.RowsMax != 1005 || m0.BytesMax != 100500 || m0.DeadMax != 5 || m0.Swept != 600 {
		t.Errorf("first minute's table %+v", m0)
	}
	if m0.P99ms != 1 {
		t.Errorf("first minute p99 %v ms, want 1", m0.P99ms)
	}
	// 100 of the second minute's 600 calls took a second: its p99 shows
	// them, its p50 does not.
	if m1.P99ms != 1000 || m1.P50ms != 1 {
		t.Errorf("second minute p50 %v, p99 %v ms; want 1, 1000", m1.P50ms, m1.P99ms)
	}
	if m2.Minute != 2 || m2.Seconds != 30 || m2.Autovacuums != 2 {
		t.Errorf("last minute %+v: want minute 2, 30 s, the autovacuum count at its end", m2)
	}
}

func TestSummarizeSoak(t *testing.T) {
	sc := defaultSoakConfig()
	sc.TTL, sc.SweepInterval = 50*time.Second, 10*time.Second
	// The table grows for a minute, then holds between 590 and 610 rows.
	rows := func(i int) int64 {
		if i < 6 {
			return int64(100 * (i + 1))
		}
		return 600 + int64(10*(i%3-1))
	}
	ss := samples(12, 10, 10, time.Millisecond, rows)
	ss[3].Errors = 4
	sum := summarizeSoak(ss, perMinute(ss), sc)
	if sum.SteadyFrom != 60 {
		t.Errorf("steady from %v s, want TTL + sweep interval = 60", sum.SteadyFrom)
	}
	if sum.RowsMin != 590 || sum.RowsMax != 610 || sum.UnexpiredMax != 305 {
		t.Errorf("steady rows %d–%d, unexpired max %d; want 590–610, 305: the first minute's growth left out", sum.RowsMin, sum.RowsMax, sum.UnexpiredMax)
	}
	if sum.TotalBytesMin != 59000 || sum.TotalBytesMax != 61000 || sum.DeadMax != 11 {
		t.Errorf("steady bytes %d–%d, dead max %d", sum.TotalBytesMin, sum.TotalBytesMax, sum.DeadMax)
	}
	if sum.Keys != 1200 || sum.KeysPerSecond != 10 || sum.Errors != 4 || sum.Seconds != 120 {
		t.Errorf("keys %d (%v/s), errors %d, seconds %v; want 1200 (10/s), 4, 120", sum.Keys, sum.KeysPerSecond, sum.Errors, sum.Seconds)
	}
	if sum.SweptPerSecond != 10 || sum.SweepBusy != 0.1 || sum.SweepRate != 100 {
		t.Errorf("swept %v/s, busy %v, %v rows per busy second; want 10, 0.1, 100", sum.SweptPerSecond, sum.SweepBusy, sum.SweepRate)
	}
	if sum.FirstMinute == nil || sum.LastMinute == nil || sum.FirstMinute.Minute != 0 || sum.LastMinute.Minute != 1 {
		t.Errorf("first and last minutes %+v, %+v", sum.FirstMinute, sum.LastMinute)
	}
	if sum.Autovacuums != 1 {
		t.Errorf("%d autovacuums, want the last sample's count", sum.Autovacuums)
	}
}

func TestSoakOutputs(t *testing.T) {
	sc := defaultSoakConfig()
	ss := samples(18, 10, 10, time.Millisecond, func(i int) int64 { return int64(500 + i) })
	rep := &soakReport{Samples: ss, Minutes: perMinute(ss), Settings: map[string]string{"autovacuum": "on"}}
	rep.Summary = summarizeSoak(ss, rep.Minutes, sc)
	var md, svg strings.Builder
	rep.markdown(&md)
	rep.svg(&svg)
	if got := strings.Count(md.String(), "\n| "); got != 1+3 {
		t.Errorf("markdown has %d table rows, want a header and 3 minutes:\n%s", got, md.String())
	}
	if got := strings.Count(svg.String(), "<polyline"); got != 11 {
		t.Errorf("chart has %d lines, want 11", got)
	}
	if got := strings.Count(svg.String(), `stroke="#2a8a4a"`); got != 2 {
		t.Errorf("chart marks %d autovacuum runs, want 2", got)
	}
}

func TestNiceCeil(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{{0, 0}, {0.3, 0.5}, {1, 1}, {1.2, 2}, {3, 5}, {7, 10}, {1700, 2000}, {45000, 50000}} {
		if got := niceCeil(c.in); got != c.want {
			t.Errorf("niceCeil(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestSoak runs a soak of a few seconds whose keys expire at once, and
// checks that the samples see the table and the sweeper at work.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	cfg := defaultConfig()
	cfg.Clients, cfg.PoolSize = 4, 4
	cfg.Soak.Duration = 3 * time.Second
	cfg.Soak.Sample = time.Second
	cfg.Soak.TTL = 500 * time.Millisecond
	cfg.Soak.SweepInterval = 200 * time.Millisecond
	cfg.Soak.Replays = 0.2
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := runSoak(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Samples) != 3 || len(rep.Minutes) != 1 {
		t.Fatalf("%d samples, %d minutes; want 3 and 1", len(rep.Samples), len(rep.Minutes))
	}
	s := rep.Summary
	if s.Keys == 0 || s.Replayed == 0 || s.Errors != 0 {
		t.Errorf("keys %d, replayed %d, errors %d (%s): want keys, replays, no error", s.Keys, s.Replayed, s.Errors, s.FirstError)
	}
	var swept int64
	for _, x := range rep.Samples {
		swept += x.Swept
		if x.TotalBytes == 0 || x.PaymentsBytes == 0 {
			t.Errorf("sample at %v s: sizes not read: %+v", x.Elapsed, x.table)
		}
	}
	if swept == 0 {
		t.Error("the sweeper deleted nothing, though keys expire after 500 ms")
	}
	if last := rep.Samples[2]; last.Rows >= last.Keys {
		t.Errorf("%d rows for %d keys: expired rows were not deleted", last.Rows, last.Keys)
	}
	if s.SweepError != "" {
		t.Errorf("sweeper: %s", s.SweepError)
	}
}

// TestSoakSharedBuffersNeedsThrowaway: -soak-shared-buffers sets a
// throwaway cluster's shared_buffers, and without -soak-throwaway it is
// refused before any server is used, rather than ignored.
func TestSoakSharedBuffersNeedsThrowaway(t *testing.T) {
	cfg := defaultConfig()
	cfg.Clients, cfg.PoolSize = 4, 4
	cfg.Soak.Duration = 3 * time.Second
	cfg.Soak.Sample = time.Second
	cfg.Soak.SharedBuffers = "1GB"
	_, err := runSoak(t.Context(), cfg, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-soak-throwaway") {
		t.Fatalf("runSoak = %v, want an error that asks for -soak-throwaway", err)
	}
}
