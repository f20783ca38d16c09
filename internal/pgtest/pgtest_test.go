package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) {
	os.Exit(Run(m))
}

// adminConn connects to the shared server's maintenance database, apart
// from pgtest's own connections.
func adminConn(t *testing.T) *pgx.Conn {
	t.Helper()
	srv, _, err := sharedServer()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func databaseName(t *testing.T, connString string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

func databaseExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var exists bool
	err := conn.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil {
		t.Fatal(err)
	}
	return exists
}

func countKeys(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insertKey(t *testing.T, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, key string) {
	t.Helper()
	_, err := q.Exec(context.Background(),
		`INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, expires_at)
		 VALUES (`+KeyIDSQL("'t'", "'/idem.Test/Do'", "$1::text")+`, 't', '/idem.Test/Do', $1, '\x01', now() + interval '1 hour')`, key)
	if err != nil {
		t.Fatal(err)
	}
}

func TestNewDatabaseHasEmptySchema(t *testing.T) {
	pool := NewPool(t)
	if n := countKeys(t, pool); n != 0 {
		t.Fatalf("idempotency_keys has %d rows, want 0", n)
	}
	var applied int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM idem_schema_migrations").Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied == 0 {
		t.Fatal("idem_schema_migrations records no migration")
	}
}

func TestNewDatabaseIsolated(t *testing.T) {
	a, b := NewDatabase(t), NewDatabase(t)
	if databaseName(t, a) == databaseName(t, b) {
		t.Fatalf("both databases are named %s", databaseName(t, a))
	}
	connA, err := pgx.Connect(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	defer connA.Close(context.Background())
	connB, err := pgx.Connect(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close(context.Background())

	insertKey(t, connA, "k1")
	if n := countKeys(t, connA); n != 1 {
		t.Fatalf("first database has %d rows, want 1", n)
	}
	if n := countKeys(t, connB); n != 0 {
		t.Fatalf("second database has %d rows, want 0", n)
	}
}

func TestNewDatabaseDroppedAfterTest(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	admin := adminConn(t)
	var name string
	t.Run("sub", func(t *testing.T) {
		// A pool left open must not keep the database from being dropped.
		pool := NewPool(t)
		name = databaseName(t, pool.Config().ConnString())
		if err := pool.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !databaseExists(t, admin, name) {
			t.Fatalf("database %s does not exist during the test", name)
		}
		// A connection of the test's own, left open on purpose: the drop
		// ends it.
		if _, err := pgx.Connect(context.Background(), pool.Config().ConnString()); err != nil {
			t.Fatal(err)
		}
	})
	if name == "" {
		t.Fatal("subtest did not run")
	}
	if databaseExists(t, admin, name) {
		t.Fatalf("database %s still exists after the test", name)
	}
}

func TestNewDatabaseParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	const n = 8
	names := make(chan string, n)
	t.Run("group", func(t *testing.T) {
		for i := range n {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				pool := NewPool(t)
				insertKey(t, pool, fmt.Sprint("k", i))
				if got := countKeys(t, pool); got != 1 {
					t.Errorf("database has %d rows, want 1", got)
				}
				names <- databaseName(t, pool.Config().ConnString())
			})
		}
	})
	close(names)
	seen := make(map[string]bool)
	for name := range names {
		if seen[name] {
			t.Errorf("database %s handed out twice", name)
		}
		seen[name] = true
	}
	if len(seen) != n {
		t.Errorf("got %d databases, want %d", len(seen), n)
	}
}

func TestCreateDatabaseConcurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL: runs without -short")
	}
	srv, _, err := sharedServer()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 8
	type result struct {
		connString string
		drop       func(context.Context) error
		err        error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := &results[i]
			r.connString, r.drop, r.err = srv.CreateDatabase(ctx)
			if r.err != nil {
				return
			}
			conn, err := pgx.Connect(ctx, r.connString)
			if err != nil {
				r.err = err
				return
			}
			defer conn.Close(ctx)
			_, r.err = conn.Exec(ctx, "SELECT FROM idempotency_keys")
		})
	}
	wg.Wait()
	seen := make(map[string]bool)
	for _, r := range results {
		if r.err != nil {
			t.Error(r.err)
			continue
		}
		seen[r.connString] = true
		if err := r.drop(ctx); err != nil {
			t.Error(err)
		}
	}
	if len(seen) != n {
		t.Errorf("got %d distinct databases, want %d", len(seen), n)
	}
}

// TestTemplateRace has several Servers, as several test processes would,
// create one new template at the same time.
func TestTemplateRace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL: runs without -short")
	}
	shared, _, err := sharedServer()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admin := adminConn(t)
	tmpl := "idem_template_race_" + randomHex(4)
	t.Cleanup(func() {
		admin.Exec(ctx, "ALTER DATABASE "+quoteIdent(tmpl)+" IS_TEMPLATE false")
		admin.Exec(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(tmpl))
	})

	const n = 6
	servers := make([]*Server, n)
	for i := range servers {
		s, err := openServer(ctx, shared.ConnString(), "test", urlProbeTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		s.templateName = tmpl
		servers[i] = s
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() { _, errs[i] = s.template(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	var allowConn, isTemplate bool
	err = admin.QueryRow(ctx, "SELECT datallowconn, datistemplate FROM pg_database WHERE datname = $1", tmpl).
		Scan(&allowConn, &isTemplate)
	if err != nil {
		t.Fatalf("template %s: %v", tmpl, err)
	}
	if allowConn || !isTemplate {
		t.Errorf("template has datallowconn=%v datistemplate=%v, want false, true", allowConn, isTemplate)
	}
	var leftovers []string
	rows, _ := admin.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", tmpl+"_")
	leftovers, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(leftovers) > 0 {
		t.Errorf("temporary template databases left behind: %v", leftovers)
	}

	connString, drop, err := servers[0].CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer drop(ctx)
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if n := countKeys(t, conn); n != 0 {
		t.Fatalf("clone has %d rows, want 0", n)
	}
}

func TestTemplateNameStable(t *testing.T) {
	a, err := templateName()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := templateName()
	if a != b || !strings.HasPrefix(a, "idem_template_") || len(a) != len("idem_template_")+12 {
		t.Fatalf("templateName() = %q, %q", a, b)
	}
}

func TestWithDatabase(t *testing.T) {
	tests := []struct {
		name, connString string
		wantTLS          bool
	}{
		{"url", "postgres://idem:s3cret@db.example:5433/appdb?sslmode=require&application_name=x", true},
		{"url without database", "postgresql://idem:s3cret@db.example:5433?sslmode=disable", false},
		{"url with dbname parameter", "postgres://idem:s3cret@db.example:5433/?dbname=appdb&sslmode=disable", false},
		{"keyword/value", "host=db.example port=5433 user=idem password='s3 cret\\' dbname=x' dbname = appdb sslmode=require", true},
		{"keyword/value with escapes", "dbname=appdb host=db.example port=5433 user=idem password=s3\\ cret sslmode=require", true},
		{"keyword/value without database", "host=db.example port=5433 user=idem password=s3cret sslmode=disable", false},
		{"url with two hosts", "postgres://idem:s3cret@db.example:5433,db2.example:5434/appdb?target_session_attrs=read-write&sslmode=disable", false},
		{"url with two hosts, one without port", "postgres://idem:s3cret@db.example:5433,db2.example/appdb?sslmode=disable", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := withDatabase(tt.connString, "idem_test_x")
			if err != nil {
				t.Fatal(err)
			}
			if isURL(got) != isURL(tt.connString) {
				t.Errorf("withDatabase(%q) = %q changed form", tt.connString, got)
			}
			orig, err := pgconn.ParseConfig(tt.connString)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := pgconn.ParseConfig(got)
			if err != nil {
				t.Fatalf("parse %q: %v", got, err)
			}
			if cfg.Database != "idem_test_x" {
				t.Errorf("database = %q, want idem_test_x (%q)", cfg.Database, got)
			}
			if cfg.Password != orig.Password || cfg.User != "idem" || cfg.Host != "db.example" || cfg.Port != 5433 {
				t.Errorf("%q lost settings: user %q password %q host %q port %d", got, cfg.User, cfg.Password, cfg.Host, cfg.Port)
			}
			if len(cfg.Fallbacks) != len(orig.Fallbacks) || (cfg.ValidateConnect == nil) != (orig.ValidateConnect == nil) {
				t.Errorf("%q lost hosts or target_session_attrs", got)
			}
			if (cfg.TLSConfig != nil) != tt.wantTLS {
				t.Errorf("%q: TLS %v, want %v", got, cfg.TLSConfig != nil, tt.wantTLS)
			}
		})
	}
}

// setEnv makes the variables of vars, and no other DATABASE_URL or PG*
// variable, the environment of t.
func setEnv(t *testing.T, vars map[string]string) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "DATABASE_URL" || strings.HasPrefix(k, "PG") {
			t.Setenv(k, "") // pgx and pgtest take an empty variable for an unset one
		}
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
}

// deadDefaults returns environment variables under which the libpq defaults
// reach no server: a socket directory with no socket in it.
func deadDefaults(t *testing.T) map[string]string {
	return map[string]string{"PGHOST": t.TempDir(), "PGPORT": "1"}
}

func TestStartWithDatabaseURL(t *testing.T) {
	shared, _, err := sharedServer()
	if err != nil {
		t.Fatal(err)
	}
	// Express the shared server as a URL, to exercise that form.
	cfg := shared.admin.Config().ConnConfig
	q := url.Values{"host": {cfg.Host}, "port": {fmt.Sprint(cfg.Port)}, "user": {cfg.User}}
	if cfg.Password != "" {
		q.Set("password", cfg.Password)
	}
	dbURL := "postgres:///" + cfg.Database + "?" + q.Encode()

	vars := deadDefaults(t)
	vars["DATABASE_URL"] = dbURL
	ctx := context.Background()
	setEnv(t, vars)
	srv, err := discovery{}.start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if srv.source != "DATABASE_URL" || srv.cluster != nil {
		t.Fatalf("server from %s, want DATABASE_URL", srv.source)
	}
	connString, drop, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer drop(ctx)
	if !isURL(connString) {
		t.Errorf("connection string %q is not a URL like DATABASE_URL", connString)
	}
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if n := countKeys(t, conn); n != 0 {
		t.Fatalf("%d rows, want 0", n)
	}
}

func TestStartDatabaseURLUnreachable(t *testing.T) {
	vars := deadDefaults(t)
	vars["DATABASE_URL"] = "host=" + vars["PGHOST"] + " port=1 dbname=idem"
	setEnv(t, vars)
	_, err := discovery{binGlobs: defaultBinGlobs}.start(context.Background())
	if err == nil {
		t.Fatal("start succeeded with an unreachable DATABASE_URL")
	}
	if msg := err.Error(); !strings.Contains(msg, "DATABASE_URL is set") || strings.Contains(msg, "libpq defaults") {
		t.Fatalf("error does not blame DATABASE_URL alone: %v", err)
	}
}

func TestStartNoPostgres(t *testing.T) {
	vars := deadDefaults(t)
	vars["PATH"] = t.TempDir()
	setEnv(t, vars)
	_, err := discovery{}.start(context.Background())
	if err == nil {
		t.Fatal("start succeeded without any PostgreSQL")
	}
	for _, want := range []string{"DATABASE_URL: not set", "libpq defaults (host=" + vars["PGHOST"], "no PostgreSQL server binaries", "apt-get install postgresql"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestThrowawayCluster starts a real cluster, as on a machine whose only
// PostgreSQL is the server package. It runs initdb and takes some seconds.
func TestThrowawayCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL: runs without -short")
	}
	vars := deadDefaults(t)
	vars["PATH"] = os.Getenv("PATH")
	ctx := context.Background()
	start := time.Now()
	setEnv(t, vars)
	srv, err := discovery{binGlobs: defaultBinGlobs}.start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster started in %v: %s", time.Since(start).Round(time.Millisecond), srv.ConnString())
	closed := false
	defer func() {
		if !closed {
			srv.Close()
		}
	}()
	if srv.cluster == nil {
		t.Fatalf("server from %s, want a throwaway cluster", srv.source)
	}
	dir := srv.cluster.dir
	socket := filepath.Join(dir, ".s.PGSQL."+clusterPort)
	if _, err := os.Stat(socket); err != nil {
		t.Fatalf("socket: %v", err)
	}

	connString, drop, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	insertKey(t, conn, "k")
	if n := countKeys(t, conn); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
	var listen, fsync string
	if err := conn.QueryRow(ctx, "SELECT current_setting('listen_addresses'), current_setting('fsync')").Scan(&listen, &fsync); err != nil {
		t.Fatal(err)
	}
	if listen != "" || fsync != "on" {
		t.Errorf("listen_addresses = %q, fsync = %q; want '', on", listen, fsync)
	}
	conn.Close(ctx)
	if err := drop(ctx); err != nil {
		t.Fatal(err)
	}

	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory %s after Close: %v", dir, err)
	}
	connectCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(connectCtx, connString); err == nil {
		conn.Close(ctx)
		t.Error("the cluster still accepts connections after Close")
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestWatchdog checks that a watchdog stops the cluster and removes its
// directory once the pipe closes, as it does when this process exits.
func TestWatchdog(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "cluster")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(tmp, "args")
	fakePgCtl := filepath.Join(tmp, "pg_ctl")
	script := "#!/bin/sh\necho \"$@\" >> '" + marker + "'\n"
	if err := os.WriteFile(fakePgCtl, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	wd, err := startWatchdog(fakePgCtl, filepath.Join(dir, "data"), dir, nil, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("watchdog acted before the pipe closed: %v", err)
	}
	// What exiting would do: close the writing end.
	liveWatchdogs.Delete(wd.w)
	wd.w.Close()
	done := make(chan error, 1)
	go func() { done <- wd.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watchdog: %v", err)
		}
	case <-time.After(10 * time.Second):
		wd.cmd.Process.Kill()
		t.Fatal("watchdog did not finish")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory after watchdog: %v", err)
	}
	args, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	if want := "stop -D " + filepath.Join(dir, "data") + " -m fast -w -t 60\n"; string(args) != want {
		t.Errorf("pg_ctl called with %q, want %q", args, want)
	}
}

func TestVersionLess(t *testing.T) {
	sorted := []string{"/usr/lib/postgresql/9.6/bin", "/usr/lib/postgresql/13/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin"}
	for i := range sorted {
		for j := range sorted {
			if got := versionLess(sorted[i], sorted[j]); got != (i < j) {
				t.Errorf("versionLess(%q, %q) = %v", sorted[i], sorted[j], got)
			}
		}
	}
}

// TestRestart starts a cluster of its own, restarts it under an open
// transaction and checks that committed rows survive, the uncommitted one
// is gone and a pool reconnects by itself.
func TestRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL: runs without -short")
	}
	ctx := context.Background()
	srv, err := StartCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if srv.cluster == nil {
		t.Fatalf("StartCluster gave a server from %s, want a throwaway cluster", srv.source)
	}
	connString, drop, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	insertKey(t, pool, "committed")
	var before int32
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insertKey(t, tx, "uncommitted")

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}

	if err := tx.Commit(ctx); err == nil {
		t.Fatal("a transaction open across the restart committed")
	}
	// A pool drops connections that fail; the query after the first
	// failure runs on a new one.
	var after int32
	err = pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after)
	if err != nil {
		err = pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after)
	}
	if err != nil {
		t.Fatalf("pool after restart: %v", err)
	}
	if after == before {
		t.Fatalf("backend %d before and after the restart", after)
	}
	var keys []string
	rows, _ := pool.Query(ctx, "SELECT key FROM idempotency_keys ORDER BY key")
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "committed" {
		t.Fatalf("keys after restart %v, want [committed]", keys)
	}
	// The admin pool was reset: databases can be created and dropped at once.
	_, drop2, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatalf("CreateDatabase after restart: %v", err)
	}
	pool.Close()
	if err := errors.Join(drop2(ctx), drop(ctx)); err != nil {
		t.Fatal(err)
	}

	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err == nil {
		t.Fatal("Restart after Close succeeded")
	}
}

func TestRestartNotOwned(t *testing.T) {
	// A server found through DATABASE_URL or the libpq defaults has no
	// cluster; pgtest must leave it alone.
	s := &Server{source: "DATABASE_URL"}
	if err := s.Restart(context.Background()); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("Restart of a server pgtest did not start: %v, want ErrNotOwned", err)
	}
}
