package readme

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdLink is an inline Markdown link or image: its target, up to a title or
// the closing parenthesis.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// heading is an ATX heading.
var heading = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)

// htmlAnchor is an explicit anchor: <a name="x"> or an id attribute.
var htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)

// prose returns the lines of Markdown text md outside fenced code blocks,
// each with its code spans blanked out, so that neither is read as a link
// or a heading. A line's index is its line number less one.
func prose(md string) []string {
	lines := strings.Split(md, "\n")
	out := make([]string, len(lines))
	fence := ""
	for i, line := range lines {
		t := strings.TrimSpace(line)
		switch {
		case fence != "":
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			continue
		case strings.HasPrefix(t, "```"), strings.HasPrefix(t, "~~~"):
			fence = t[:3]
			continue
		}
		out[i] = blankCode(line)
	}
	return out
}

// blankCode removes the code spans of a line (`x`, “x“).
func blankCode(line string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(line, '`')
		if i < 0 {
			b.WriteString(line)
			return b.String()
		}
		n := len(line[i:]) - len(strings.TrimLeft(line[i:], "`"))
		closing := strings.Index(line[i+n:], strings.Repeat("`", n))
		if closing < 0 {
			b.WriteString(line)
			return b.String()
		}
		b.WriteString(line[:i])
		line = line[i+n+closing+n:]
	}
}

// slug is GitHub's anchor for a heading's text: lower case, the markup of
// code spans and links dropped, punctuation but '-' and '_' removed,
// spaces made '-'.
func slug(text string) string {
	text = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of Markdown text md: one per heading, a
// repeated one numbered as GitHub numbers them, and the explicit ones.
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	raw := strings.Split(md, "\n")
	for i, line := range prose(md) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(raw[i], -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(raw[i])
		if line == "" || m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// brokenLinks returns, as "file:line: message" with file relative to root,
// the relative links of the Markdown files under root that name no file, or
// an anchor into a Markdown file that names none of its headings, and how
// many relative links it checked.
func brokenLinks(t *testing.T, root string) ([]string, int) {
	t.Helper()
	files := markdownFiles(t, root)
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := cache[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		cache[path] = anchors(string(b))
		return cache[path]
	}
	var problems []string
	checked := 0
	for _, f := range files {
		file, name := f.path, f.name
		for i, line := range prose(f.text) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, frag, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
					if _, err := os.Stat(dest); err != nil {
						problems = append(problems, fmt.Sprintf("%s:%d: the link %s names no file", name, i+1, target))
						continue
					}
				}
				if frag != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[frag] {
					problems = append(problems, fmt.Sprintf("%s:%d: the link %s names no heading of %s", name, i+1, target, filepath.Base(dest)))
				}
			}
		}
	}
	return problems, checked
}

// mdFile is a Markdown file under a root.
type mdFile struct {
	path string // as found under the root
	name string // relative to the root, with slashes
	text string
}

// markdownFiles returns the Markdown files under root, outside .git and
// node_modules.
func markdownFiles(t *testing.T, root string) []mdFile {
	t.Helper()
	var files []mdFile
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		name, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		files = append(files, mdFile{path: path, name: filepath.ToSlash(name), text: string(b)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestMarkdownLinks checks every relative link of the repository's Markdown
// files: the file it names exists, and an anchor into a Markdown file names
// one of its headings. Moving a section from one page to another must move
// the links to it.
func TestMarkdownLinks(t *testing.T) {
	problems, checked := brokenLinks(t, filepath.Join("..", ".."))
	report(t, problems, checked, "relative link")
}

// report fails t with each of problems, and when checked is 0: a check that
// found no thing (what) to check proves nothing.
func report(t *testing.T, problems []string, checked int, what string) {
	t.Helper()
	for _, p := range problems {
		t.Error(p)
	}
	if checked == 0 {
		t.Fatalf("found no %s to check", what)
	}
}

// TestBrokenLinks checks that brokenLinks finds a link to a missing file, to
// a missing heading and to a missing heading of the same page, and passes
// the links that resolve, the ones in code left alone.
func TestBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", `# idem

[modes](docs/modes.md#choosing-a-mode-atomic-optimistic-or-leased), [http](docs/modes.md#httpjson),
[gone](docs/usage.md), [no such section](docs/modes.md#operations), [here](#idem), [nowhere](#usage)
and [the second](docs/modes.md#leased-1), `+"`[in code](missing.md)`"+`

`+"```"+`
[in a block](missing.md)
# not a heading
`+"```"+`
`)
	write("docs/modes.md", "# Choosing a mode: atomic, optimistic or leased\n\n## `Leased`\n\n## HTTP/JSON\n\n### Leased\n\n```sh\n# leased\n```\n")
	problems, checked := brokenLinks(t, dir)
	want := []string{
		"README.md:4: the link docs/usage.md names no file",
		"README.md:4: the link docs/modes.md#operations names no heading of modes.md",
		"README.md:4: the link #usage names no heading of README.md",
	}
	if strings.Join(problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("brokenLinks found\n%s\nwant\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
	if checked != 7 {
		t.Errorf("brokenLinks checked %d links, want 7", checked)
	}
}
