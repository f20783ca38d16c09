// Package readme checks that the Go snippets of README.md, CONTRIBUTING.md
// and every page under docs/ compile: each one must appear, verbatim but
// for white space, in a Go file of the repository that CI vets and builds
// (most are in examples/internal/readme; the handler test of docs/testing.md
// is internal/testdata/shop's, which .ci/run builds, vets and tests through
// its run.sh); that every relative link of the repository's Markdown files
// names a file, and a heading where it has an anchor (links_test.go); and
// runs the shell blocks of the walkthrough in docs/operations.md as written
// (operations_test.go).
package readme

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fence opens a Go code block, indented or not.
var fence = regexp.MustCompile("^( *)```go\\s*$")

// snippets returns the Go code blocks of the Markdown text md, dedented.
func snippets(md string) []string {
	var (
		out    []string
		cur    []string
		indent string
		in     bool
	)
	for _, line := range strings.Split(md, "\n") {
		switch {
		case !in && fence.MatchString(line):
			in, indent, cur = true, fence.FindStringSubmatch(line)[1], nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			out = append(out, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, strings.TrimPrefix(line, indent))
		}
	}
	return out
}

// squash removes white space, which gofmt and Markdown lay out differently.
func squash(s string) string {
	return strings.Join(strings.Fields(s), "")
}

// compiled reports whether snippet s is in one of the squashed Go files
// sources: verbatim but for white space, or, for a snippet with lines that
// are only "..." (code left out, as tools/doccheck reads them), each part
// between them in the same file, in the snippet's order.
func compiled(sources []string, s string) bool {
	var parts []string
	var cur []string
	for _, line := range strings.Split(s, "\n") {
		if strings.TrimSpace(line) == "..." {
			parts, cur = append(parts, squash(strings.Join(cur, "\n"))), nil
			continue
		}
		cur = append(cur, line)
	}
	parts = append(parts, squash(strings.Join(cur, "\n")))
next:
	for _, src := range sources {
		rest := src
		for _, p := range parts {
			i := strings.Index(rest, p)
			if i < 0 {
				continue next
			}
			rest = rest[i+len(p):]
		}
		return true
	}
	return false
}

// docs returns the Markdown files whose Go snippets must be compiled, as
// paths relative to root: README.md, CONTRIBUTING.md and every page under
// docs/.
func docs(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestReadmeSnippetsAreCompiled(t *testing.T) {
	root := filepath.Join("..", "..")
	var sources []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" && path != filepath.Join(root, "internal", "testdata")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sources = append(sources, squash(string(b)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	files := docs(t, root)
	n := 0
	for _, name := range files {
		md, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range snippets(string(md)) {
			n++
			if !compiled(sources, s) {
				t.Errorf("%s's Go snippet %d is in no Go file of the repository, so nothing compiles it; put it, as it is, in examples/internal/readme:\n%s", name, i+1, s)
			}
		}
	}
	if n == 0 {
		t.Fatalf("%v have no Go snippets", files)
	}
}
