// Package migrations holds idem's database schema as plain SQL files, named
// NNNN_title.up.sql and NNNN_title.down.sql so that psql and golang-migrate
// read them as they are. Every statement is idempotent (IF NOT EXISTS).
//
// Most programs apply them with postgres.Migrate from
// github.com/idemkit/idem/store/postgres; FS is for tools that want the
// files themselves.
package migrations

import "embed"

// FS holds the migration files at its root.
//
//go:embed *.sql
var FS embed.FS
