// Package readme holds the Go snippets of idem's README.md, so that the
// compiler checks them: internal/readme's test finds each snippet of the
// README, verbatim, in a Go file of the repository.
package readme
