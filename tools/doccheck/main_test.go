package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir, err := filepath.Abs(filepath.Join("testdata", "links"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := load(dir, append(os.Environ(), "GOWORK=off"), []string{"./..."})
	if err != nil {
		t.Fatal(err)
	}
	got := c.check()
	md, err := c.checkMarkdown(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, md...)
	for i, p := range got {
		got[i] = strings.TrimPrefix(p, dir+string(filepath.Separator))
	}
	slices.Sort(got)
	want := []string{
		"README.md:14: Go block does not compile: invalid operation: links.New(ctx).Name + 1 (mismatched types string and untyped int)",
		"README.md:24: Go block does not compile: too many arguments in call to links.New(nil).Run have (number) want ()",
		"links.go:12: Go block does not compile: cannot use links.New(ctx) (value of type *links.T) as int value in variable declaration",
		"links.go:30: doc link [Old]: package example.com/links declares no Old",
		"links.go:30: doc link [T.Stop]: type links.T has no method or field Stop",
		"links.go:30: doc link [strings.Nothing]: package strings declares no Nothing",
		"links.go:31: doc link [T].Gone: type links.T has no method or field Gone",
		"links.go:31: doc link [nopkg.Name]: no package named nopkg is imported by example.com/links",
		"links_test.go:3: doc link [Helper]: package example.com/links declares no Helper",
	}
	if c.blocks != 5 {
		t.Errorf("%d Go blocks checked, want 5 (the shell and SQL ones are not Go)", c.blocks)
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
