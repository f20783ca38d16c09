package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// pgBouncerStartTimeout bounds starting PgBouncer until it answers a
	// query through it.
	pgBouncerStartTimeout = 30 * time.Second
	// pgBouncerStopTimeout bounds waiting for PgBouncer to exit after
	// SIGTERM, before SIGKILL.
	pgBouncerStopTimeout = 10 * time.Second

	defaultPgBouncerPoolSize      = 2
	defaultPgBouncerMaxClientConn = 500
)

// PgBouncerExecMode is the pgx QueryExecMode of the connection strings a
// [PgBouncer] hands out, as their default_query_exec_mode: "exec", which
// sends every statement as an unnamed statement in one round trip with the
// values of its parameters. PgBouncer before 1.21 keeps no prepared
// statement across transactions, so pgx's default, which prepares named
// statements and reuses them, fails through it in transaction mode ("prepared
// statement ... does not exist"), and so does "describe_exec", which
// describes a statement in one round trip and runs it in the next.
const PgBouncerExecMode = "exec"

// defaultPgBouncerDirs are where PgBouncer is commonly installed, after
// PATH: Debian's package puts it in /usr/sbin, which is not in a user's
// PATH.
var defaultPgBouncerDirs = []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/bin", "/opt/homebrew/bin", "/usr/bin"}

const howToGetPgBouncer = `Install PgBouncer (e.g. apt-get install pgbouncer, dnf install pgbouncer, brew install pgbouncer);
idem's .ci/run installs the Debian package when it is missing.`

// PgBouncerOptions configures a PgBouncer that [StartPgBouncer] starts.
// The zero value is a pool of 2 server connections per database for up to
// 500 clients.
type PgBouncerOptions struct {
	// PoolSize is PgBouncer's default_pool_size: how many connections to
	// PostgreSQL it opens per database, which all of that database's
	// clients share. Zero means 2.
	PoolSize int
	// MaxClientConn is PgBouncer's max_client_conn: how many clients it
	// accepts in all. Zero means 500.
	MaxClientConn int
	// QueryWaitTimeout is PgBouncer's query_wait_timeout, rounded up to
	// whole seconds: how long a client waits for a server connection
	// before PgBouncer fails its query and disconnects it. Zero means
	// PgBouncer's default, 120 s.
	QueryWaitTimeout time.Duration
	// ServerLoginRetry is PgBouncer's server_login_retry, rounded up to
	// whole seconds: how long it waits, after it failed to connect to the
	// server, before it tries again; meanwhile its clients' queries wait.
	// Zero means PgBouncer's default, 15 s.
	ServerLoginRetry time.Duration
}

// PgBouncer is a PgBouncer process in transaction pooling mode in front of
// a [Server], listening on a loopback port: every database of the server is
// reachable through it, so a database made by [Server.CreateDatabase] or
// [NewDatabase] is too. It is safe for concurrent use.
//
// It is for idem's tests of the store behind a transaction-mode pooler.
type PgBouncer struct {
	srv  *Server
	host string
	port int
	// user is the role PgBouncer logs in to PostgreSQL as.
	user    string
	dir     string
	logFile string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for

	closeOnce sync.Once
	closeErr  error
}

// StartPgBouncer starts PgBouncer (1.18 or later) in pool_mode =
// transaction in front of s, on a free loopback port, with a configuration
// of its own in a temporary directory: authentication of clients switched
// off (auth_type = any) and every database name routed to s as the role s
// connects as. The caller must call [PgBouncer.Close], which stops it and
// removes the directory.
//
// PgBouncer is looked up in PATH and in the usual installation directories
// (/usr/sbin for Debian's package). When it is missing, the error says how
// to install it. PgBouncer refuses to run as root, so when the process runs
// as root it runs as the OS user postgres, as a throwaway cluster does.
func StartPgBouncer(ctx context.Context, s *Server, opts PgBouncerOptions) (*PgBouncer, error) {
	if opts.PoolSize <= 0 {
		opts.PoolSize = defaultPgBouncerPoolSize
	}
	if opts.MaxClientConn <= 0 {
		opts.MaxClientConn = defaultPgBouncerMaxClientConn
	}
	bin := findPgBouncer(os.Getenv("PATH"))
	if bin == "" {
		return nil, fmt.Errorf("pgbouncer is not installed: not in PATH nor in %s\n%s",
			strings.Join(defaultPgBouncerDirs, ", "), howToGetPgBouncer)
	}
	backend, err := pgconn.ParseConfig(s.connString)
	if err != nil {
		return nil, fmt.Errorf("parse the server's connection string: %w", err)
	}
	runAs, err := clusterUser()
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	// A port that is free now may be taken before PgBouncer binds it; then
	// PgBouncer exits, and another port is tried.
	var errs []error
	for range 3 {
		b, err := startPgBouncer(ctx, s, bin, backend, runAs, opts)
		if err == nil {
			return b, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	return nil, fmt.Errorf("start pgbouncer: %w", errors.Join(errs...))
}

var errAddrInUse = errors.New("the port was taken")

func startPgBouncer(ctx context.Context, s *Server, bin string, backend *pgconn.Config, runAs *osUser, opts PgBouncerOptions) (_ *PgBouncer, err error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(tempBase(runAs), "idem-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{
		srv:     s,
		host:    "127.0.0.1",
		port:    port,
		user:    backend.User,
		dir:     dir,
		logFile: filepath.Join(dir, "pgbouncer.log"),
		exited:  make(chan struct{}),
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
		}
	}()
	if runAs != nil {
		if err := os.Chown(dir, int(runAs.uid), int(runAs.gid)); err != nil {
			return nil, err
		}
	}
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(ini, []byte(b.config(backend, opts)), 0o644); err != nil {
		return nil, err
	}
	// What PgBouncer writes before its log file is open.
	out, err := os.Create(filepath.Join(dir, "output.log"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(bin, ini)
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = daemonProcAttr(runAs, false)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b.cmd = cmd
	go func() {
		_ = cmd.Wait()
		close(b.exited)
	}()
	if err := b.waitReady(ctx, backend.Database); err != nil {
		return nil, err
	}
	return b, nil
}

// config returns PgBouncer's configuration file.
func (b *PgBouncer) config(backend *pgconn.Config, opts PgBouncerOptions) string {
	// Every database name, the per-test ones included, goes to the server,
	// logging in as the role pgtest uses.
	target := "host=" + iniValue(backend.Host) + " port=" + strconv.Itoa(int(backend.Port)) +
		" user=" + iniValue(backend.User)
	if backend.Password != "" {
		target += " password=" + iniValue(backend.Password)
	}
	tlsMode := "disable"
	if requiresTLS(backend) {
		tlsMode = "require"
	}
	return fmt.Sprintf(`; idem's pgtest: a PgBouncer in front of a test server.
[databases]
* = %s

[pgbouncer]
listen_addr = %s
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = %d
server_tls_sslmode = %s
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
log_connections = 0
log_disconnections = 0
`, target, b.host, b.port, opts.PoolSize, opts.MaxClientConn, tlsMode,
		b.logFile, filepath.Join(b.dir, "pgbouncer.pid")) +
		secondsSetting("query_wait_timeout", opts.QueryWaitTimeout) +
		secondsSetting("server_login_retry", opts.ServerLoginRetry)
}

// iniValue quotes v as a value of a [databases] entry of pgbouncer.ini,
// which PgBouncer reads with a quote written twice inside quotes.
func iniValue(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// secondsSetting returns the line of setting name, in whole seconds, for
// d rounded up, or nothing for zero.
func secondsSetting(name string, d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprintf("%s = %d\n", name, int((d+time.Second-1)/time.Second))
}

// requiresTLS reports whether cfg connects only over TLS (sslmode=require
// or stricter), as PgBouncer must then do too.
func requiresTLS(cfg *pgconn.Config) bool {
	if cfg.TLSConfig == nil {
		return false
	}
	for _, fb := range cfg.Fallbacks {
		if fb.TLSConfig == nil {
			return false
		}
	}
	return true
}

// waitReady waits until a query through PgBouncer into the database
// dbname answers.
func (b *PgBouncer) waitReady(ctx context.Context, dbname string) error {
	ctx, cancel := context.WithTimeout(ctx, pgBouncerStartTimeout)
	defer cancel()
	connString := b.connString(dbname)
	var lastErr error
	for {
		select {
		case <-b.exited:
			out := tail(filepath.Join(b.dir, "output.log"), 2000) + "\n" + tail(b.logFile, 2000)
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("%w: %s", errAddrInUse, out)
			}
			return fmt.Errorf("pgbouncer exited during start (%v):\n%s", b.cmd.ProcessState, out)
		default:
		}
		lastErr = b.probe(ctx, connString)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgbouncer does not answer after %v: %w\npgbouncer log:\n%s",
				pgBouncerStartTimeout, lastErr, tail(b.logFile, 2000))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// probe runs a query through PgBouncer.
func (b *PgBouncer) probe(ctx context.Context, connString string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

// ConnString returns a connection string that reaches the database of
// connString, a connection string of the server b is in front of (such as
// [NewDatabase] returns), through b. It sets pgx's
// default_query_exec_mode to [PgBouncerExecMode].
func (b *PgBouncer) ConnString(connString string) (string, error) {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return "", fmt.Errorf("parse connection string: %w", err)
	}
	return b.connString(cfg.Database), nil
}

func (b *PgBouncer) connString(dbname string) string {
	q := url.Values{"sslmode": {"disable"}, "default_query_exec_mode": {PgBouncerExecMode}}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(b.user),
		Host:     net.JoinHostPort(b.host, strconv.Itoa(b.port)),
		Path:     "/" + dbname,
		RawQuery: q.Encode(),
	}
	return u.String()
}

// Close stops PgBouncer, which ends every client's connection through it,
// and removes its directory. Close may be called more than once.
func (b *PgBouncer) Close() error {
	b.closeOnce.Do(func() {
		var errs []error
		if b.cmd != nil {
			// SIGTERM: PgBouncer (before 1.23) shuts down at once.
			_ = b.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-b.exited:
			case <-time.After(pgBouncerStopTimeout):
				_ = b.cmd.Process.Kill()
				<-b.exited
			}
		}
		if err := os.RemoveAll(b.dir); err != nil {
			errs = append(errs, err)
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// findPgBouncer returns the path of the pgbouncer executable, in path (a
// PATH value) or defaultPgBouncerDirs, or "".
func findPgBouncer(path string) string {
	if p := lookPath("pgbouncer", path); p != "" {
		return p
	}
	return lookPath("pgbouncer", strings.Join(defaultPgBouncerDirs, string(filepath.ListSeparator)))
}

// freePort returns a loopback TCP port that is free now.
func freePort() (int, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := lis.Addr().(*net.TCPAddr).Port
	return port, lis.Close()
}

// NewPgBouncer starts a PgBouncer ([StartPgBouncer]) in front of the
// server that [NewDatabase] uses, and stops it when tb has finished. It
// fails tb, never skips it, when PgBouncer or PostgreSQL cannot be had;
// under go test -short it skips tb, as NewDatabase does.
func NewPgBouncer(tb testing.TB, opts PgBouncerOptions) *PgBouncer {
	tb.Helper()
	srv := sharedServerFor(tb, "PostgreSQL and PgBouncer")
	ctx, cancel := context.WithTimeout(context.Background(), pgBouncerStartTimeout+10*time.Second)
	defer cancel()
	b, err := StartPgBouncer(ctx, srv, opts)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("pgtest: stop pgbouncer: %v", err)
		}
	})
	return b
}

// NewDatabase creates a database for tb alone on the server b is in front
// of, as the package's [NewDatabase] does, and returns a connection string
// for it through b ([PgBouncer.ConnString]). The database is dropped when
// tb and its subtests have finished.
func (b *PgBouncer) NewDatabase(tb testing.TB) string {
	tb.Helper()
	connString, err := b.ConnString(createDatabaseFor(tb, b.srv))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return connString
}

// NewPool is [PgBouncer.NewDatabase] followed by pgxpool.New: a pool on a
// new database of tb's own, through b. The pool is closed when tb has
// finished, before the database is dropped.
func (b *PgBouncer) NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), b.NewDatabase(tb))
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
