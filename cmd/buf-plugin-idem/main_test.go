package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"buf.build/go/bufplugin/check/checktest"
)

var update = flag.Bool("update", false, "rewrite testdata/buf-lint.golden with what buf lint prints")

// files are the test's .proto files, and what they import from idem's
// repository: idem's options and the vendored google.api.http annotations.
var files = &checktest.ProtoFileSpec{
	DirPaths:  []string{"testdata/proto", "../../proto", "../../examples/proto"},
	FilePaths: []string{"lint/v1/cases.proto"},
}

func TestSpec(t *testing.T) {
	checktest.SpecTest(t, spec)
}

// reported is the annotation for the method named at a line of
// testdata/proto/lint/v1/cases.proto (one-based, as an editor shows it),
// whose declaration ends at column end (zero-based, exclusive) of line
// last.
func reported(method string, line, last, end int, why string) checktest.ExpectedAnnotation {
	return checktest.ExpectedAnnotation{
		RuleID: ruleID,
		Message: fmt.Sprintf("lint.v1.CaseService.%s looks mutating (%s) but has no (idem.v1.method) option: "+
			"set one, mark it idempotency_level = IDEMPOTENT, or opt out with a leading comment "+
			"\"// buf:lint:ignore IDEM_METHOD_POLICY <reason>\".", method, why),
		FileLocation: &checktest.ExpectedFileLocation{
			FileName:    "lint/v1/cases.proto",
			StartLine:   line - 1,
			StartColumn: 2,
			EndLine:     last - 1,
			EndColumn:   end,
		},
	}
}

// ignored is the annotation for a field the method's (idem.v1.method)
// option sets that idem ignores, the method declared as for reported.
func ignored(method string, line, last, end int, what string) checktest.ExpectedAnnotation {
	a := reported(method, line, last, end, "")
	a.Message = fmt.Sprintf("lint.v1.CaseService.%s: (idem.v1.method).%s.", method, what)
	return a
}

// TestCheck runs the rule on its own, without buf: CancelOrder's comment
// ignore is buf's to honor (TestBufLint), so the plugin reports it.
func TestCheck(t *testing.T) {
	ignoredLease := ignored("RefundOrder", 75, 77, 3, "lease is set, but mode is unset (MODE_ATOMIC): only MODE_LEASED reads it")
	ignoredHeaders := ignored("PayOrder", 80, 82, 3, "finish_headers is set without finish: nothing keeps the headers for a finisher")
	for _, tc := range []struct {
		name    string
		options map[string]any
		want    []checktest.ExpectedAnnotation
	}{{
		name: "default prefixes",
		want: []checktest.ExpectedAnnotation{
			reported("CreateOrder", 12, 12, 46, `its name begins with "Create"`),
			reported("Checkout", 15, 20, 3, "google.api.http POST"),
			reported("Archive", 24, 29, 3, "google.api.http DELETE"),
			reported("CancelOrder", 63, 63, 46, `its name begins with "Cancel"`),
			ignoredLease, ignoredHeaders,
		},
	}, {
		name:    "prefixes of one's own",
		options: map[string]any{prefixesOption: []string{"Lookup", "Address"}},
		want: []checktest.ExpectedAnnotation{
			reported("Checkout", 15, 20, 3, "google.api.http POST"),
			reported("Archive", 24, 29, 3, "google.api.http DELETE"),
			reported("Lookup", 32, 34, 3, `its name begins with "Lookup"`),
			reported("Address", 69, 69, 42, `its name begins with "Address"`),
			ignoredLease, ignoredHeaders,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			checktest.CheckTest{
				Request:             &checktest.RequestSpec{Files: files, Options: tc.options},
				Spec:                spec,
				ExpectedAnnotations: tc.want,
			}.Run(t)
		})
	}
}

func TestMutatingName(t *testing.T) {
	prefixes := []string{"Create", "Set", "Add"}
	for _, tc := range []struct {
		name, want string
	}{
		{"CreateOrder", "Create"},
		{"Create", "Create"},
		{"Set2FA", "Set"},
		{"Set_Color", "Set"},
		{"Settings", ""},
		{"Address", ""},
		{"Created", ""},
		{"GetOrder", ""},
		{"create_order", ""},
	} {
		got, ok := mutatingName(tc.name, prefixes)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("mutatingName(%q) = %q, %v; want %q", tc.name, got, ok, tc.want)
		}
	}
}

// TestBufLint runs buf lint, at the version idem's tools pin, with the
// plugin as a user's buf.yaml names it, on testdata/proto and the files it
// imports, and compares what buf prints with testdata/buf-lint.golden
// (rewrite it with -update). Only buf can show that a "buf:lint:ignore
// IDEM_METHOD_POLICY" comment opts a method out.
func TestBufLint(t *testing.T) {
	bin := t.TempDir()
	goCmd(t, "build", "-o", bin, ".")
	buf := strings.TrimSpace(goCmd(t, "tool", "-n", "-modfile=../../tools/go.mod", "buf"))

	work := t.TempDir()
	for dst, src := range map[string]string{
		"proto":                               "testdata/proto",
		"idem/idem/v1/options.proto":          "../../proto/idem/v1/options.proto",
		"google/google/api/http.proto":        "../../examples/proto/google/api/http.proto",
		"google/google/api/annotations.proto": "../../examples/proto/google/api/annotations.proto",
	} {
		copyTree(t, src, filepath.Join(work, dst))
	}
	config := `version: v2
modules:
  - path: proto
  - path: idem
  - path: google
lint:
  use:
    - IDEM_METHOD_POLICY
  ignore:
    - idem
    - google
plugins:
  - plugin: buf-plugin-idem
`
	if err := os.WriteFile(filepath.Join(work, "buf.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(buf, "lint")
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if exit := (*exec.ExitError)(nil); !errors.As(err, &exit) || exit.ExitCode() != 100 {
		t.Fatalf("buf lint: %v, want exit status 100 (lint failures)\n%s%s", err, got, stderr.Bytes())
	}
	golden := filepath.Join("testdata", "buf-lint.golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("buf lint printed\n%s\nwant (%s)\n%s", got, golden, want)
	}
}

// goCmd runs the go command in the module, outside any workspace, and
// returns what it printed.
func goCmd(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// copyTree copies the file or directory src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
