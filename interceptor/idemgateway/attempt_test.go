package idemgateway_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/idemkit/idem"
)

// TestAttemptHeader: the Idempotency-Attempt header of an HTTP request
// reaches the engine through the gateway: a method in idem.ModeAuto claims
// a request marked 1 reading nothing first, and one marked 2, or not
// marked, reading first. A retry wrongly marked 1 still gets the first
// answer, replayed, and one transfer stands.
func TestAttemptHeader(t *testing.T) {
	var (
		mu      sync.Mutex
		reports []idem.Report
	)
	e := newEnv(t, config{server: []idem.Option{
		idem.WithMethodPolicy(createMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeAuto}),
		idem.WithReportHook(func(_ context.Context, r idem.Report) {
			mu.Lock()
			defer mu.Unlock()
			reports = append(reports, r)
		}),
	}})
	last := func() idem.Report {
		mu.Lock()
		defer mu.Unlock()
		return reports[len(reports)-1]
	}
	for _, c := range []struct {
		name, key string
		headers   []string
		want      bool
	}{
		{"first attempt", "order-a1", []string{idem.HTTPAttemptHeader, "1"}, true},
		{"lower case", "order-a2", []string{"idempotency-attempt", "1"}, true},
		{"retry", "order-a3", []string{idem.HTTPAttemptHeader, "2"}, false},
		{"unmarked", "order-a4", nil, false},
	} {
		r := e.create(t, transfer, append([]string{"Idempotency-Key", c.key}, c.headers...)...)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", c.name, r.status, r.body)
		}
		if rep := last(); rep.Result != idem.ResultExecuted || rep.Mode != idem.ModeAuto || rep.Optimistic != c.want {
			t.Fatalf("%s: %+v; want executed in mode auto, optimistic %v", c.name, rep, c.want)
		}
	}
	first := e.create(t, transfer, "Idempotency-Key", "order-a1", idem.HTTPAttemptHeader, "1")
	if first.status != http.StatusOK || first.header.Get(idem.HTTPReplayedHeader) != "true" {
		t.Fatalf("retry marked as a first attempt: %d %v %s; want the first answer, replayed", first.status, first.header, first.body)
	}
	if rep := last(); rep.Result != idem.ResultReplayed || !rep.Optimistic {
		t.Fatalf("retry marked as a first attempt: %+v; want replayed after a claim that read nothing", rep)
	}
	if n := e.count(t, `SELECT count(*) FROM transfers WHERE request_key = 'order-a1'`); n != 1 {
		t.Fatalf("%d transfers of order-a1, want 1", n)
	}
	if n := e.count(t, `SELECT count(*) FROM transfers`); n != 4 {
		t.Fatalf("%d transfers, want 4", n)
	}
}
