package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestCapacity measures a small table and checks that the figures add up,
// not what they are.
func TestCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL: runs without -short")
	}
	cfg := defaultConfig()
	cfg.Capacity = capacityConfig{Rows: 2000, Sweeps: []sweepSetting{{500, time.Millisecond}, {5000, 0}}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := runCapacity(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rows != 2000 {
		t.Errorf("%d rows measured, want 2000", rep.Rows)
	}
	// A tuple and its line pointer fit in the heap's bytes per row, and a
	// page (8 KiB) holds at least one tuple.
	if rep.TupleBytes < 100 || rep.HeapPerRow < rep.TupleBytes+4 || rep.HeapPerRow > 8192 {
		t.Errorf("tuple %v bytes, heap %v bytes per row", rep.TupleBytes, rep.HeapPerRow)
	}
	names := map[string]bool{}
	for _, ix := range rep.Indexes {
		names[ix.Name] = true
	}
	if !names["idempotency_keys_pkey"] || !names["idempotency_keys_expires_at_brin"] {
		t.Errorf("indexes %v: want the primary key and the expiry BRIN", names)
	}
	cols := map[string]float64{}
	for _, c := range rep.Columns {
		cols[c.Name] = c.Bytes
	}
	if cols["id"] != 16 || cols["key"] != 37 {
		t.Errorf("columns %v: want a 16-byte id and a 36-byte key (and its 1-byte header)", cols)
	}
	if len(rep.Sweeps) != 2 {
		t.Fatalf("%d sweeps, want 2", len(rep.Sweeps))
	}
	for _, s := range rep.Sweeps {
		if s.Deleted != 2000 || s.PerSecond <= 0 {
			t.Errorf("%s: deleted %d at %v rows/s, want every expired row and none of the live one", s.sweepSetting, s.Deleted, s.PerSecond)
		}
	}
	var md strings.Builder
	rep.markdown(&md)
	if !strings.Contains(md.String(), "| 10000 | 24 h | 864 M |") {
		t.Errorf("sizing table misses 10 000/s for 24 h:\n%s", md.String())
	}
}

func TestLabels(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{count(360), "360"}, {count(360e3), "360 k"}, {count(8.64e6), "8.64 M"}, {count(8.64e8), "864 M"},
		{bytesLabel(512), "0.5 KiB"}, {bytesLabel(120 << 20), "120 MiB"}, {bytesLabel(2.79 * (1 << 30)), "2.79 GiB"},
		{ttlLabel(24 * time.Hour), "24 h"}, {ttlLabel(90 * time.Second), "1m30s"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
