package pgtest

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPgBouncerPoolsTransactions checks that NewPgBouncer's PgBouncer is in
// front of the shared server in transaction mode: clients more than its
// pool share the pool's server connections, one transaction at a time, and
// reach a database NewDatabase made.
func TestPgBouncerPoolsTransactions(t *testing.T) {
	b := NewPgBouncer(t, PgBouncerOptions{PoolSize: 1})
	direct := NewDatabase(t)
	through, err := b.ConnString(direct)
	if err != nil {
		t.Fatal(err)
	}
	if databaseName(t, through) != databaseName(t, direct) {
		t.Fatalf("ConnString(%q) = %q: another database", direct, through)
	}
	cfg, err := pgxpool.ParseConfig(through)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeExec {
		t.Errorf("exec mode %v, want exec", cfg.ConnConfig.DefaultQueryExecMode)
	}
	cfg.MaxConns = 4
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	insertKey(t, pool, "k")
	pids := make(map[uint32]bool)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var pid uint32
				if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return err
				}
				if n := countKeys(t, tx); n != 1 {
					t.Errorf("%d keys through pgbouncer, want 1", n)
				}
				mu.Lock()
				pids[pid] = true
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(pids) != 1 {
		t.Errorf("transactions of %d clients ran on %d server connections, want the pool's 1", cfg.MaxConns, len(pids))
	}
	if st := pool.Stat(); st.TotalConns() < 2 {
		t.Errorf("the test's pool opened %d connections; the case needs more clients than server connections", st.TotalConns())
	}
}

// TestPgBouncerMissing checks that a machine without PgBouncer gets an
// error that says how to install it.
func TestPgBouncerMissing(t *testing.T) {
	// No server is reached: the binary is looked for first.
	srv := &Server{connString: "host=/nonexistent user=idem dbname=postgres"}
	dirs := defaultPgBouncerDirs
	defaultPgBouncerDirs = []string{t.TempDir()}
	t.Cleanup(func() { defaultPgBouncerDirs = dirs })
	t.Setenv("PATH", t.TempDir())
	_, err := StartPgBouncer(context.Background(), srv, PgBouncerOptions{})
	if err == nil || !strings.Contains(err.Error(), "apt-get install pgbouncer") {
		t.Fatalf("StartPgBouncer without pgbouncer: %v; want an error that says how to install it", err)
	}
}
