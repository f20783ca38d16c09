package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the whole demo: run fails unless every invariant it checks
// (one payment per key, replays, rejections, row counts) held.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"retry after loss", "order-1003=1", "order-1004=0", "idem results of CreatePayment: executed=4 replayed=51", "every invariant held"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
