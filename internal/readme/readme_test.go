// Package readme checks that the Go snippets of README.md compile: each one
// must appear, verbatim but for white space, in a Go file of the repository
// that CI vets and builds (most are in examples/internal/readme; the handler
// test of "Testing" is internal/testdata/shop's, which .ci/run builds, vets
// and tests through its run.sh), and runs the shell blocks of the
// "Operations" walkthrough as written (operations_test.go).
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

func TestReadmeSnippetsAreCompiled(t *testing.T) {
	root := filepath.Join("..", "..")
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var sources strings.Builder
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
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
		sources.WriteString(squash(string(b)))
		sources.WriteString("\x00")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	all := sources.String()
	found := snippets(string(md))
	if len(found) == 0 {
		t.Fatal("README.md has no Go snippets")
	}
	for i, s := range found {
		if !strings.Contains(all, squash(s)) {
			t.Errorf("README.md's Go snippet %d is in no Go file of the repository, so nothing compiles it; put it, as it is, in examples/internal/readme:\n%s", i+1, s)
		}
	}
}
