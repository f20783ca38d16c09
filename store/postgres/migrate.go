package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/migrations"
)

// Beginner starts transactions; *pgxpool.Pool, *pgx.Conn and pgx.Tx
// implement it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate applies the migrations of package
// github.com/idemkit/idem/migrations that db has not applied yet, each in
// its own transaction, and records them in the table
// idem_schema_migrations. Applying them again is a no-op, and replicas that
// start at the same time may all call Migrate: each version is claimed with
// the same unique insert idem uses for keys, so one applies it while the
// others wait and then skip it.
func Migrate(ctx context.Context, db Beginner) error {
	files, err := upMigrations()
	if err != nil {
		return err
	}
	if err := createVersionTable(ctx, db); err != nil {
		return err
	}
	for _, f := range files {
		if err := applyMigration(ctx, db, f); err != nil {
			return fmt.Errorf("postgres: migration %s: %w", f.name, err)
		}
	}
	return nil
}

type migration struct {
	version int
	name    string
}

func upMigrations() ([]migration, error) {
	names, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		return nil, err
	}
	out := make([]migration, 0, len(names))
	for _, name := range names {
		prefix, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			return nil, fmt.Errorf("postgres: migration %q is not named NNNN_title.up.sql", name)
		}
		out = append(out, migration{version: v, name: name})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

func createVersionTable(ctx context.Context, db Beginner) error {
	const ddl = `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`
	// Concurrent CREATE TABLE IF NOT EXISTS can still collide in the
	// catalog; the loser sees a unique violation and the table exists.
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, ddl)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == uniqueViolation {
		return nil
	}
	if err != nil {
		return fmt.Errorf("postgres: create idem_schema_migrations: %w", err)
	}
	return nil
}

func applyMigration(ctx context.Context, db Beginner, m migration) error {
	sql, err := fs.ReadFile(migrations.FS, m.name)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var claimed bool
		err := tx.QueryRow(ctx,
			`INSERT INTO idem_schema_migrations (version, name) VALUES ($1, $2)
			 ON CONFLICT (version) DO NOTHING RETURNING true`,
			m.version, m.name).Scan(&claimed)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // applied before, or by a replica that got here first
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, string(sql))
		return err
	})
}
