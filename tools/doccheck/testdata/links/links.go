// Package links holds doc links and Go blocks, good and bad, for doccheck's
// test.
//
// A Go block whose surroundings (ctx) are left out:
//
//	t := links.New(ctx)
//	t.Run()
//	if err := t.Check(); err != nil { ... }
//
// A Go block that does not compile:
//
//	var n int = links.New(ctx)
//
// Blocks that are not Go:
//
//	go run ./links -flag
//	SELECT 1
package links

import "strings"

// T links to [New], [T.Run], [T.Name], [*T], [T].Name, [strings.Builder],
// [strings.Builder.Len], [links.New], [errors.Is], [strings], and has a[i]
// and [i], which are not links.
type T struct {
	Name string
	b    strings.Builder
}

// New returns a [T]; it links to [Old], [T.Stop], [strings.Nothing],
// [T].Gone and [nopkg.Name], which name nothing.
func New(ctx any) *T { return &T{} }

// Run runs t.
func (t *T) Run() {}

// Check checks t.
func (t *T) Check() error { return nil }
