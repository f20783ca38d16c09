package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/migrations"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres/internal/pgerr"
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
	// Concurrent CREATE TABLE IF NOT EXISTS statements collide in the
	// catalog (a unique violation, or "type already exists"), so replicas
	// that start together take turns: a transaction-scoped advisory lock
	// (one of idem's, see lockClass; a claim whose key hashes to 0 may wait
	// for it a moment), which a transaction-mode pooler keeps no trace of.
	// The next one then finds the table. A unique violation is still read
	// as the table made meanwhile, by a Migrate that takes no such lock.
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, 0)`, lockClass); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ddl)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerr.UniqueViolation {
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

// Check reports whether the store can claim keys: it reaches the database
// through the store's pool and checks that every migration of package
// github.com/idemkit/idem/migrations has been applied. A missing or
// outdated schema fails with an error that wraps store.ErrNotReady and says
// which migrations are missing; a database that cannot be reached fails
// with the driver's error. Call it at start-up, after [Migrate] or in its
// place where another tool applies the schema, so that a server that
// cannot serve keyed calls says so before it takes traffic. A claim that
// meets a missing or outdated schema fails the same way, and the
// engine answers INTERNAL (never UNAVAILABLE, which clients retry
// for ever).
//
// A sharded store (see [NewSharded]) checks every shard, and its error
// names each shard that fails by its index.
func (s *Store) Check(ctx context.Context) error {
	switch len(s.shards) {
	case 0:
		return fmt.Errorf("%w: the store has no shards", ErrNoShard)
	case 1:
		if s.shards[0] == nil {
			return fmt.Errorf("%w: its pool is nil", ErrNoShard)
		}
		return check(ctx, s.shards[0])
	}
	var errs []error
	for i, pool := range s.shards {
		if pool == nil {
			errs = append(errs, fmt.Errorf("postgres: shard %d: %w: its pool is nil", i, ErrNoShard))
		} else if err := check(ctx, pool); err != nil {
			errs = append(errs, fmt.Errorf("postgres: shard %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// check is Check on one database.
func check(ctx context.Context, pool *pgxpool.Pool) error {
	files, err := upMigrations()
	if err != nil {
		return err
	}
	var applied []int
	rows, err := pool.Query(ctx, `SELECT version FROM idem_schema_migrations`)
	if err == nil {
		applied, err = pgx.CollectRows(rows, pgx.RowTo[int])
	}
	if err != nil {
		if errors.Is(pgerr.Interpret(err), store.ErrNotReady) {
			return fmt.Errorf("%w (idem_schema_migrations: %w)", pgerr.ErrSchema, err)
		}
		return fmt.Errorf("postgres: checking idem's schema: %w", err)
	}
	var missing []string
	for _, f := range files {
		if !slices.Contains(applied, f.version) {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w (not applied: %s)", pgerr.ErrSchema, strings.Join(missing, ", "))
	}
	return nil
}
