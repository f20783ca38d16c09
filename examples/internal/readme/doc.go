// Package readme holds the Go snippets of idem's README.md and of its
// pages in docs/, so that the compiler checks them: internal/readme's test
// finds each snippet of those files, verbatim, in a Go file of the
// repository.
package readme
