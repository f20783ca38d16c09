package readme

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// delimiterRow is a table's second line: |---|:--:|---:|.
var delimiterRow = regexp.MustCompile(`^\|(\s*:?-+:?\s*\|)+$`)

// cells returns how many cells a table row has: the pipes that are neither
// escaped nor in a code span (blanked out by prose), less the outer ones.
func cells(row string) int {
	return strings.Count(strings.ReplaceAll(strings.TrimSpace(row), `\|`, ""), "|") - 1
}

// brokenTables returns, as "file:line: message" with file relative to root,
// the rows of the Markdown files' tables whose cells are not as many as
// their header's, and how many tables it checked. A row with more cells
// than the header loses the rest on GitHub, and a table pasted into a row
// by mistake shows as one such row.
func brokenTables(t *testing.T, root string) ([]string, int) {
	t.Helper()
	var problems []string
	checked := 0
	for _, f := range markdownFiles(t, root) {
		lines := prose(f.text)
		for i := 1; i < len(lines); i++ {
			head := strings.TrimSpace(lines[i-1])
			if !strings.HasPrefix(head, "|") || !delimiterRow.MatchString(strings.TrimSpace(lines[i])) {
				continue
			}
			checked++
			want := cells(head)
			for j := i; j < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[j]), "|"); j++ {
				if got := cells(lines[j]); got != want {
					problems = append(problems, fmt.Sprintf("%s:%d: a row of %d cells in a table of %d", f.name, j+1, got, want))
				}
				i = j
			}
		}
	}
	return problems, checked
}

// TestMarkdownTables checks that every row of every table in the
// repository's Markdown has as many cells as its header.
func TestMarkdownTables(t *testing.T) {
	problems, checked := brokenTables(t, filepath.Join("..", ".."))
	report(t, problems, checked, "table")
}

// TestBrokenTables checks that brokenTables finds a row with too many cells
// and one with too few, and passes pipes in code spans, escaped pipes and
// tables in fenced code.
func TestBrokenTables(t *testing.T) {
	dir := t.TempDir()
	md := "# t\n\n" +
		"| a | b |\n|---|---:|\n| `x | y` | \\| |\n| 1 | 2 | | c | d |\n| 3 |\n\n" +
		"```\n| a | b |\n|---|---|\n| 1 |\n```\n\n" +
		"| c |\n|:-:|\n| 5 |\n"
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	problems, checked := brokenTables(t, dir)
	want := []string{
		"README.md:6: a row of 5 cells in a table of 2",
		"README.md:7: a row of 1 cells in a table of 2",
	}
	if checked != 2 || strings.Join(problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("checked %d tables, found:\n%s\nwant 2 tables and:\n%s", checked, strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
}
