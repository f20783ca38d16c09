package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// urlProbeTimeout bounds connecting to DATABASE_URL, which the user
	// chose and which may be a remote server.
	urlProbeTimeout = 10 * time.Second
	// defaultsProbeTimeout bounds connecting with the libpq defaults, where
	// no answer just means there is no server.
	defaultsProbeTimeout = 3 * time.Second
	// minServerVersion is the first release with DROP DATABASE ... WITH
	// (FORCE).
	minServerVersion = 130000
)

// SQLSTATE codes pgtest handles.
const (
	invalidCatalogName = "3D000" // database does not exist
	duplicateDatabase  = "42P04"
	uniqueViolation    = "23505"
	objectInUse        = "55006" // database is being accessed by other users
)

// Server is a PostgreSQL server on which pgtest creates databases: the one
// DATABASE_URL names, the one the libpq defaults reach, or a throwaway
// cluster. It is safe for concurrent use.
type Server struct {
	// connString reaches the maintenance database on which databases are
	// created and dropped.
	connString string
	admin      *pgxpool.Pool
	// source says where the server came from, for messages.
	source string
	// cluster is the throwaway cluster this Server started, or nil.
	cluster *cluster

	templateName string
	templateMu   sync.Mutex
	templateDone bool

	closeOnce sync.Once
	closeErr  error
	closed    chan struct{}
}

// Start finds a PostgreSQL server, or starts a throwaway cluster, in the
// order the package documentation gives. The caller must call
// [Server.Close] when done, which stops a throwaway cluster.
//
// When no PostgreSQL can be had, the error says what was tried and how to
// get PostgreSQL: set DATABASE_URL, or install the PostgreSQL server package
// (for example with apt-get install postgresql).
func Start(ctx context.Context) (*Server, error) {
	return defaultDiscovery().start(ctx)
}

// StartCluster starts a throwaway cluster, as the last step of [Start]
// does, but whatever DATABASE_URL and the libpq defaults say: it is for
// tests that must own their server, for example to restart it under load
// with [Server.Restart]. It runs initdb, which takes a few seconds. The
// caller must call [Server.Close], which stops the cluster and removes its
// directory.
//
// When the machine has no PostgreSQL server binaries, the error says how to
// install them.
func StartCluster(ctx context.Context) (*Server, error) {
	return StartClusterWith(ctx)
}

// StartClusterWith is [StartCluster] with settings added to the cluster's
// postgresql.conf, one "name = value" line each ("shared_buffers =
// '6GB'"), after the ones pgtest writes, so that they override them.
func StartClusterWith(ctx context.Context, settings ...string) (*Server, error) {
	s, err := defaultDiscovery().openCluster(ctx, settings...)
	if err != nil {
		return nil, fmt.Errorf("start a throwaway PostgreSQL cluster: %w\n%s", err, howToGetServerBinaries)
	}
	return s, nil
}

const howToGetServerBinaries = `A throwaway cluster needs the PostgreSQL server binaries initdb, pg_ctl and postgres; install the
PostgreSQL server package (e.g. apt-get install postgresql, dnf install postgresql-server,
brew install postgresql).`

// ErrNotOwned is returned by [Server.Restart] for a server that pgtest did
// not start: one found through DATABASE_URL or the libpq defaults.
var ErrNotOwned = errors.New("pgtest: the server was not started by pgtest, so it is not pgtest's to restart")

// Restart stops the throwaway cluster s started as a crash would, and starts
// it again on the same data directory and socket. The stop is pg_ctl's
// immediate mode: every session is cut off at once, uncommitted
// transactions are lost, and the start recovers committed ones from the
// write-ahead log. Restart returns once the server accepts connections
// again.
//
// Connections opened before the restart fail on their next use; a pgxpool
// replaces them with new ones. Restart may run while other goroutines use
// the server, which is what it is for; after [Server.Close] it fails. For a
// server that s did not start, Restart does nothing and returns
// [ErrNotOwned].
func (s *Server) Restart(ctx context.Context) error {
	if s.cluster == nil {
		return ErrNotOwned
	}
	if err := s.cluster.restart(ctx); err != nil {
		return fmt.Errorf("restart throwaway cluster in %s: %w", s.cluster.dir, err)
	}
	// The pool's connections died with the server; drop them now rather
	// than on the next CreateDatabase.
	s.admin.Reset()
	return nil
}

// ConnString returns a connection string for the server's maintenance
// database, on which pgtest creates and drops databases. It is the form
// DATABASE_URL had, if that was used, and includes its password.
func (s *Server) ConnString() string { return s.connString }

// CreateDatabase creates a new database with idem's migrations applied and
// no rows. It returns a connection string for it and a function that drops
// it, along with any connections still open to it. Call drop before
// [Server.Close]; once a throwaway cluster is closed, drop has nothing left
// to do and returns nil.
func (s *Server) CreateDatabase(ctx context.Context) (connString string, drop func(context.Context) error, err error) {
	tmpl, err := s.template(ctx)
	if err != nil {
		return "", nil, err
	}
	name := "idem_test_" + randomHex(8)
	create := "CREATE DATABASE " + quoteIdent(name) + " TEMPLATE " + quoteIdent(tmpl)
	err = retryInUse(ctx, func() error {
		_, err := s.admin.Exec(ctx, create)
		return err
	})
	if err != nil {
		return "", nil, fmt.Errorf("create database %s from %s: %w", name, tmpl, err)
	}
	connString, err = withDatabase(s.connString, name)
	if err != nil {
		return "", nil, err
	}
	drop = func(ctx context.Context) error {
		if s.cluster != nil && s.isClosed() {
			return nil
		}
		if err := dropDatabase(ctx, s.admin, name); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	return connString, drop, nil
}

// Close stops and removes a throwaway cluster this Server started, and
// closes the Server's own connections. A server found through DATABASE_URL
// or the libpq defaults keeps running. Close may be called more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.admin.Close()
		if s.cluster != nil {
			s.closeErr = s.cluster.stop()
		}
	})
	return s.closeErr
}

func (s *Server) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// discovery finds a server. It reads DATABASE_URL, PATH and, through pgx,
// the PG* variables from the process's environment, which tests set with
// t.Setenv.
type discovery struct {
	// binGlobs are where server binaries are looked for after PATH and
	// pg_config.
	binGlobs []string
}

func defaultDiscovery() discovery {
	return discovery{binGlobs: defaultBinGlobs}
}

// start finds a server in the documented order.
func (d discovery) start(ctx context.Context) (*Server, error) {
	if dbURL := os.Getenv("DATABASE_URL"); dbURL != "" {
		s, err := openServer(ctx, dbURL, "DATABASE_URL", urlProbeTimeout)
		if err != nil {
			return nil, fmt.Errorf("DATABASE_URL is set, but %w\n%s", err, howToGetPostgres)
		}
		return s, nil
	}
	tried := []string{"DATABASE_URL: not set"}

	// The libpq defaults are what the empty connection string reaches: pgx
	// reads the PG* variables and fills in the rest as libpq does.
	where := "PG* environment variables"
	defaults, err := pgconn.ParseConfig("")
	if err == nil {
		where = fmt.Sprintf("host=%s port=%d user=%s", defaults.Host, defaults.Port, defaults.User)
		var s *Server
		s, err = openServer(ctx, "", "the libpq defaults ("+where+")", defaultsProbeTimeout)
		if err == nil {
			return s, nil
		}
	}
	tried = append(tried, fmt.Sprintf("libpq defaults (%s): %v", where, err))

	s, err := d.openCluster(ctx)
	if err == nil {
		return s, nil
	}
	tried = append(tried, fmt.Sprintf("throwaway cluster: %v", err))

	return nil, fmt.Errorf("no PostgreSQL server for idem; tried:\n\t%s\n%s",
		strings.Join(tried, "\n\t"), howToGetPostgres)
}

// openCluster starts a throwaway cluster with settings (see
// [discovery.startCluster]) and opens it as a Server that owns it.
func (d discovery) openCluster(ctx context.Context, settings ...string) (*Server, error) {
	c, err := d.startCluster(ctx, settings...)
	if err != nil {
		return nil, err
	}
	s, err := openServer(ctx, c.connString, "a throwaway cluster in "+c.dir, urlProbeTimeout)
	if err != nil {
		if stopErr := c.stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return nil, err
	}
	s.cluster = c
	return s, nil
}

const howToGetPostgres = `To get PostgreSQL, either set DATABASE_URL to a server on which the role may create databases
(e.g. DATABASE_URL=postgres://postgres:secret@localhost:5432/postgres), or install the PostgreSQL
server package so that a throwaway cluster can be started (e.g. apt-get install postgresql,
dnf install postgresql-server, brew install postgresql).`

// isURL reports whether connString is in URL form rather than keyword/value.
func isURL(connString string) bool {
	return strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://")
}

// withDatabase returns connString with its database replaced by dbname, one
// of pgtest's own names, which need no quoting, keeping everything else,
// such as password and sslmode, as it was. It appends a dbname setting in
// connString's own form, a query parameter of a URL or a keyword of a
// keyword/value string: libpq and pgx both take the last of a repeated
// setting, and a URL's parameters over its path. pgx's parser checks the
// result.
func withDatabase(connString, dbname string) (string, error) {
	var out string
	switch {
	case !isURL(connString):
		out = strings.TrimLeft(connString+" dbname="+dbname, " ")
	case strings.Contains(connString, "?"):
		out = connString + "&dbname=" + dbname
	default:
		out = connString + "?dbname=" + dbname
	}
	cfg, err := pgconn.ParseConfig(out)
	if err != nil {
		return "", fmt.Errorf("parse connection string: %w", err)
	}
	if cfg.Database != dbname {
		return "", fmt.Errorf("connection string names database %q after setting %q", cfg.Database, dbname)
	}
	return out, nil
}

// openServer connects to the server connString reaches and checks that pgtest
// can work there: PostgreSQL 13 or later, and a role that may create
// databases. The maintenance database is the one connString names, else
// postgres, else template1.
func openServer(ctx context.Context, connString, source string, timeout time.Duration) (*Server, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("parse connection string: %w", err)
	}
	var conn *pgx.Conn
	adminString := connString
	if cfg.Database != "" {
		conn, err = connect(ctx, adminString, timeout)
	} else {
		for _, db := range []string{"postgres", "template1"} {
			adminString, err = withDatabase(connString, db)
			if err != nil {
				return nil, err
			}
			conn, err = connect(ctx, adminString, timeout)
			if pgErrorCode(err) != invalidCatalogName {
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())

	if err := checkServer(ctx, conn, timeout); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, adminString)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	tmpl, err := templateName()
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &Server{
		connString:   adminString,
		admin:        pool,
		source:       source,
		templateName: tmpl,
		closed:       make(chan struct{}),
	}, nil
}

func connect(ctx context.Context, connString string, timeout time.Duration) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("parse connection string: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}

// checkServer checks the server's version and the role's privileges.
func checkServer(ctx context.Context, conn *pgx.Conn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var version int
	var role string
	var mayCreate bool
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_user,
		(SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user)`).
		Scan(&version, &role, &mayCreate)
	if err != nil {
		return fmt.Errorf("check server: %w", err)
	}
	if version < minServerVersion {
		return fmt.Errorf("server is PostgreSQL %d.%d; idem's tests need 13 or later", version/10000, version%10000)
	}
	if !mayCreate {
		return fmt.Errorf("role %s may not create databases (grant it CREATEDB)", role)
	}
	return nil
}

func pgErrorCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// retryInUse calls f until it does not fail with object_in_use, which
// CREATE DATABASE and ALTER DATABASE report while another session is still
// connected to the database they need to themselves; sessions that just
// disconnected take a moment to go.
func retryInUse(ctx context.Context, f func() error) error {
	const limit = 10 * time.Second
	deadline := time.Now().Add(limit)
	wait := 20 * time.Millisecond
	for {
		err := f()
		if pgErrorCode(err) != objectInUse || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

func dropDatabase(ctx context.Context, db *pgxpool.Pool, name string) error {
	_, err := db.Exec(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(name)+" WITH (FORCE)")
	return err
}

func quoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }
