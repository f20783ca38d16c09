package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
)

// TestBulk: a dry run on a terminal by default, refused elsewhere without
// -yes; with -yes, each key's result on stdout and the progress on
// stderr, call after call with -all; a live lease skipped unless -force.
func TestBulk(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		both := []string{"bulk", "forget", "-tenant", "acme", "-state", "in_progress,recorded", "-limit", "1", "-reason", "cleanup after the test"}
		out, errOut, exit := idem(t, f.cmd(both...)...)
		if exit != 2 || !strings.Contains(errOut, "give -yes") || out != "" {
			t.Fatalf("bulk forget without -yes, not on a terminal: exit %d, %q, %q; want a usage error", exit, out, errOut)
		}

		isTerminal = func() bool { return true }
		defer func() { isTerminal = func() bool { return false } }()
		out, errOut, exit = idem(t, f.cmd(both...)...)
		if exit != 0 || !strings.HasPrefix(out, "Dry run: 2 keys match; the first 1, which one call would forget:") ||
			!strings.Contains(out, "order-7") || !strings.Contains(errOut, "Nothing was changed. Add -yes") {
			t.Fatalf("bulk forget on a terminal: exit %d, stdout %q, stderr %q; want a dry run", exit, out, errOut)
		}
		if got := rows(t, ok(t, f.cmd("keys", "list", "-tenant", "acme")...)); len(got) != 2 {
			t.Fatalf("a dry run changed the keys: %q", got)
		}

		out, errOut, exit = idem(t, f.cmd(append(both, "-yes", "-all")...)...)
		if exit != 0 {
			t.Fatalf("bulk forget -yes -all: exit %d, stderr %q", exit, errOut)
		}
		for _, want := range []string{
			`(?m)^order-7 +acme +` + regexp.QuoteMeta(checkout) + ` +skipped +idem admin: the key's lease is live until 2026-01-02T03:05:05Z`,
			`(?m)^pay-1 +acme +` + regexp.QuoteMeta(doMethod) + ` +done +-$`,
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("bulk forget printed\n%s\nwant a line matching %s", out, want)
			}
		}
		if !strings.Contains(errOut, "forget: 0 done, 1 skipped; resume with -page-token ") || !strings.HasSuffix(errOut, "forget: 1 done, 1 skipped\n") {
			t.Errorf("bulk forget's progress: %q", errOut)
		}
		f.advance(time.Second)
		batch := unmarshal(t, ok(t, f.cmd(append(both, "-yes", "-force", "-o", "json")...)...), &adminv1.KeyBatch{})
		if rs := batch.GetResults(); len(rs) != 1 || rs[0].GetKey() != "order-7" || rs[0].GetOutcome() != adminv1.KeyResult_OUTCOME_DONE {
			t.Errorf("bulk forget -force -o json: %v", batch)
		}
		hist := ok(t, f.cmd("keys", "history", "-tenant", "acme", "-method", checkout, "order-7")...)
		if !strings.Contains(hist, "cleanup after the test") || !strings.Contains(hist, " true ") {
			t.Errorf("order-7's history after bulk forget -force:\n%s", hist)
		}
	})
}

// TestStdinIsTerminal: the null device and a pipe, a script's usual
// input, are no terminal.
func TestStdinIsTerminal(t *testing.T) {
	orig := os.Stdin
	defer func() { os.Stdin = orig }()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, f := range map[string]*os.File{"the null device": null, "a pipe": r} {
		os.Stdin = f
		if stdinIsTerminal() {
			t.Errorf("%s is taken for a terminal", name)
		}
	}
}
