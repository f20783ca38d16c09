package main

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
)

// TestHistoryAndAuditList: the actions an operator makes with the command
// are in the key's history and the audit trail, with their reasons.
func TestHistoryAndAuditList(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		ok(t, f.cmd("keys", "forget", "-tenant", "acme", "-method", checkout, "order-7", "-force", "-reason", "a loop in the handler")...)
		f.advance(time.Minute)
		ok(t, f.cmd("keys", "forget", "-tenant", "acme", "-method", doMethod, "pay-1", "-reason", "a test payment")...)

		out := ok(t, f.cmd("keys", "history", "-tenant", "acme", "-method", checkout, "order-7")...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "TIME ACTION KEY TENANT METHOD OPERATOR FORCE BEFORE AFTER REASON" {
			t.Fatalf("history:\n%s\nwant a header and one entry", out)
		}
		if want := "2026-01-02T03:04:06Z forget order-7 acme " + checkout + " oncall true in_progress - a loop in the handler"; strings.Join(strings.Fields(lines[1]), " ") != want {
			t.Errorf("history's entry:\n%s\nwant %s", lines[1], want)
		}

		all := unmarshal(t, ok(t, f.cmd("audit", "list", "-all-tenants", "-o", "json")...), &adminv1.ListAuditResponse{})
		if es := all.GetEntries(); len(es) != 2 || es[0].GetKey() != "order-7" || es[1].GetKey() != "pay-1" || es[1].GetReason() != "a test payment" {
			t.Errorf("audit list -all-tenants: %v", all)
		}
		since := unmarshal(t, ok(t, f.cmd("audit", "list", "-tenant", "acme", "-since", "2026-01-02T03:05:00Z", "-o", "json")...), &adminv1.ListAuditResponse{})
		if es := since.GetEntries(); len(es) != 1 || es[0].GetKey() != "pay-1" {
			t.Errorf("audit list -since: %v, want pay-1's forget", since)
		}
		until := unmarshal(t, ok(t, f.cmd("audit", "list", "-tenant", "acme", "-until", "2026-01-02T03:05:00Z", "-o", "json")...), &adminv1.ListAuditResponse{})
		if es := until.GetEntries(); len(es) != 1 || es[0].GetKey() != "order-7" {
			t.Errorf("audit list -until: %v, want order-7's forget", until)
		}
		_, errOut, exit := idem(t, f.cmd("audit", "list", "-tenant", "acme", "-limit", "1")...)
		if m := regexp.MustCompile(`-page-token (\S+)`).FindStringSubmatch(errOut); exit != 0 || m == nil {
			t.Errorf("audit list -limit 1: exit %d, stderr %q; want the next page's token", exit, errOut)
		}
	})
}

// TestStats prints the counts and the oldest key in progress.
func TestStats(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		out := ok(t, f.cmd("keys", "stats", "-tenant", "acme")...)
		for _, want := range []string{
			`(?m)^acme +` + regexp.QuoteMeta(checkout) + ` +in_progress +1$`,
			`(?m)^acme +` + regexp.QuoteMeta(doMethod) + ` +recorded +1$`,
			`(?m)^oldest in progress: order-7 \(tenant acme, method ` + regexp.QuoteMeta(checkout) + `\), created 2026-01-02T03:04:05Z, lease until 2026-01-02T03:05:05Z$`,
			`(?m)^oldest abandoned: none$`,
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("stats printed\n%s\nwant a line matching %s", out, want)
			}
		}
		f.advance(2 * time.Minute) // order-7's lease runs out
		resp := unmarshal(t, ok(t, f.cmd("keys", "stats", "-all-tenants", "-state", "abandoned", "-o", "json")...), &adminv1.GetKeyStatsResponse{})
		if c := resp.GetCounts(); len(c) != 1 || c[0].GetCount() != 1 || resp.GetOldestAbandoned().GetKey() != "order-7" {
			t.Errorf("stats of the abandoned keys: %v", resp)
		}
	})
}

// watchWriter is the standard output of list -watch: it cancels the
// command's context once it has seen n listings.
type watchWriter struct {
	mu     sync.Mutex
	b      strings.Builder
	n      int
	cancel context.CancelFunc
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if strings.Count(w.b.String(), "interrupt to stop") >= w.n && strings.HasSuffix(w.b.String(), "\n\n") {
		w.cancel()
	}
	return len(p), nil
}

// TestListWatch: list -watch lists again on its interval until its
// context ends (an interrupt, for the command), and then ends without an
// error.
func TestListWatch(t *testing.T) {
	f := newFixture(t, "grpc")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &watchWriter{n: 3, cancel: cancel}
	var errOut strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- dispatch(ctx, f.cmd("keys", "list", "-tenant", "acme", "-watch", "10ms"), out, &errOut)
	}()
	if err := <-done; err != nil {
		t.Fatalf("list -watch: %v, stderr %q", err, errOut.String())
	}
	out.mu.Lock()
	got := out.b.String()
	out.mu.Unlock()
	if n := strings.Count(got, "interrupt to stop"); n < 3 {
		t.Errorf("list -watch listed %d times before its context ended, want 3:\n%s", n, got)
	}
	if n := strings.Count(got, "order-7"); n < 3 {
		t.Errorf("list -watch printed order-7 %d times:\n%s", n, got)
	}
}
