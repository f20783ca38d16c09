package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	initdbTimeout   = 2 * time.Minute
	pgCtlTimeout    = 90 * time.Second // pg_ctl itself waits at most 60 s
	pgConfigTimeout = 10 * time.Second

	// clusterUserName is the OS user a cluster runs as when the process
	// runs as root, and the name of the cluster's superuser.
	clusterUserName = "postgres"
	clusterPort     = "5432"
)

// defaultBinGlobs are where PostgreSQL server binaries are commonly
// installed, besides PATH and pg_config --bindir.
var defaultBinGlobs = []string{
	"/usr/lib/postgresql/*/bin",                          // Debian, Ubuntu
	"/usr/pgsql-*/bin",                                   // PGDG RPMs
	"/usr/local/pgsql/bin",                               // built from source
	"/opt/homebrew/opt/postgresql*/bin",                  // Homebrew, Apple silicon
	"/usr/local/opt/postgresql*/bin",                     // Homebrew, Intel
	"/Applications/Postgres.app/Contents/Versions/*/bin", // Postgres.app
}

// cluster is a throwaway PostgreSQL cluster in a temporary directory, which
// holds the data directory, the server log and the server's Unix socket.
type cluster struct {
	dir        string
	dataDir    string
	logFile    string
	binDir     string
	pgCtl      string
	connString string
	// runAs is the OS user the cluster runs as, or nil for the current one.
	runAs *osUser
	env   []string

	watchdog *watchdog

	// mu orders restart and stop.
	mu       sync.Mutex
	started  bool
	stopped  bool
	stopOnce sync.Once
	stopErr  error
}

// osUser is an OS user to run the cluster's commands as.
type osUser struct {
	name     string
	uid, gid uint32
}

// startCluster creates and starts a throwaway cluster with the server
// binaries found on the machine. settings are added to its postgresql.conf,
// one "name = value" line each.
func (d discovery) startCluster(ctx context.Context, settings ...string) (*cluster, error) {
	c, err := d.newCluster(ctx)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.stop()
		}
	}()
	if _, err := c.run(ctx, initdbTimeout, c.bin("initdb"),
		"-D", c.dataDir, "--auth=trust", "--username="+clusterUserName,
		"--encoding=UTF8", "--locale=C"); err != nil {
		return nil, err
	}
	if err := c.configure(settings...); err != nil {
		return nil, err
	}
	c.started = true
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// newCluster makes the directory of a throwaway cluster, owned by the
// cluster's user, and starts its watchdog; the data directory is still to
// be made. Call stop when done, or on failure.
func (d discovery) newCluster(ctx context.Context) (*cluster, error) {
	if !clusterSupported {
		return nil, errors.New("throwaway clusters need a Unix-like system")
	}
	binDir, err := d.findBinDir(ctx)
	if err != nil {
		return nil, err
	}
	runAs, err := clusterUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(tempBase(runAs), "idem-pgtest-")
	if err != nil {
		return nil, err
	}
	c := &cluster{
		dir:        dir,
		dataDir:    filepath.Join(dir, "data"),
		logFile:    filepath.Join(dir, "postgres.log"),
		binDir:     binDir,
		pgCtl:      filepath.Join(binDir, "pg_ctl"),
		connString: clusterConnString([]string{dir}, "postgres", nil),
		runAs:      runAs,
		env:        childEnv(),
	}
	if runAs != nil {
		if err := os.Chown(dir, int(runAs.uid), int(runAs.gid)); err != nil {
			c.stop()
			return nil, err
		}
	}
	// Start the watchdog first, so that nothing is left behind even if this
	// process dies while the cluster starts.
	c.watchdog, _ = startWatchdog(c.pgCtl, c.dataDir, c.dir, c.runAs, c.env) // best effort
	return c, nil
}

// bin returns the path of the PostgreSQL program name.
func (c *cluster) bin(name string) string { return filepath.Join(c.binDir, name) }

// start starts the server on the existing data directory and waits until it
// accepts connections.
func (c *cluster) start(ctx context.Context) error {
	if _, err := c.run(ctx, pgCtlTimeout, c.pgCtl, "start", "-D", c.dataDir, "-l", c.logFile, "-w", "-t", "60"); err != nil {
		return fmt.Errorf("%w\nserver log:\n%s", err, tail(c.logFile, 2000))
	}
	return nil
}

// restart stops the server as a crash would and starts it again: pg_ctl
// stop -m immediate ends every process at once, without a checkpoint, so
// the start recovers from the write-ahead log.
func (c *cluster) restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("the throwaway cluster was stopped")
	}
	if _, err := c.run(ctx, pgCtlTimeout, c.pgCtl, "stop", "-D", c.dataDir, "-m", "immediate", "-w", "-t", "60"); err != nil {
		return err
	}
	return c.start(ctx)
}

// configure makes the server listen only on a Unix socket in c.dir, and
// adds settings, one "name = value" line each. The settings go into
// postgresql.conf rather than onto the pg_ctl command line, which pg_ctl
// passes through a shell; they are appended, so they override what the
// file said before.
func (c *cluster) configure(settings ...string) error {
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "\n# idem's pgtest: a throwaway cluster, reachable only through its Unix socket.\n"+
		"listen_addresses = ''\nunix_socket_directories = %s\nport = %s\n",
		confString(c.dir), clusterPort)
	for _, s := range settings {
		if err == nil {
			_, err = fmt.Fprintln(f, s)
		}
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	return err
}

// stop stops the server, if it was started, and removes the directory.
func (c *cluster) stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopOnce.Do(func() {
		c.stopped = true
		var errs []error
		if c.started {
			ctx := context.Background()
			_, err := c.run(ctx, pgCtlTimeout, c.pgCtl, "stop", "-D", c.dataDir, "-m", "fast", "-w", "-t", "60")
			if err != nil {
				// Try harder; if that fails too, the server notices that
				// its directory is gone within a minute and shuts down.
				if _, err2 := c.run(ctx, pgCtlTimeout, c.pgCtl, "stop", "-D", c.dataDir, "-m", "immediate", "-w", "-t", "60"); err2 != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, err)
		}
		if c.watchdog != nil {
			c.watchdog.cancel()
		}
		c.stopErr = errors.Join(errs...)
		if c.stopErr != nil {
			c.stopErr = fmt.Errorf("stop throwaway cluster in %s: %w", c.dir, c.stopErr)
		}
	})
	return c.stopErr
}

// run runs a PostgreSQL program as the cluster's user, within timeout.
func (c *cluster) run(ctx context.Context, timeout time.Duration, name string, args ...string) ([]byte, error) {
	return runCommand(ctx, timeout, c.runAs, c.dir, c.env, name, args...)
}

// runCommand runs name with args within timeout and returns its combined
// output; its error includes the output.
func runCommand(ctx context.Context, timeout time.Duration, runAs *osUser, dir string, env []string, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = sysProcAttr(runAs, false)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		what := filepath.Base(name)
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			what += " " + args[0]
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timeout %v)", err, timeout)
		}
		return out, fmt.Errorf("%s: %w\n%s", what, err, bytes.TrimSpace(out))
	}
	return out, nil
}

// findBinDir returns a directory that holds initdb, pg_ctl and postgres:
// that of initdb in PATH, else pg_config --bindir, else the newest version
// that d.binGlobs match.
func (d discovery) findBinDir(ctx context.Context) (string, error) {
	path := os.Getenv("PATH")
	var candidates []string
	if p := lookPath("initdb", path); p != "" {
		// Follow symlinks: pg_ctl finds postgres next to its real self.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	if p := lookPath("pg_config", path); p != "" {
		out, err := runCommand(ctx, pgConfigTimeout, nil, "", childEnv(), p, "--bindir")
		if err == nil {
			candidates = append(candidates, strings.TrimSpace(string(out)))
		}
	}
	for _, pattern := range d.binGlobs {
		matches, _ := filepath.Glob(pattern)
		sort.Slice(matches, func(i, j int) bool { return versionLess(matches[j], matches[i]) })
		candidates = append(candidates, matches...)
	}
	for _, dir := range candidates {
		if isExecutable(filepath.Join(dir, "initdb")) &&
			isExecutable(filepath.Join(dir, "pg_ctl")) &&
			isExecutable(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	where := append([]string{"PATH", "pg_config --bindir"}, d.binGlobs...)
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, pg_ctl, postgres) in %s", strings.Join(where, ", "))
}

// lookPath finds an executable in the directories of path, a PATH value.
func lookPath(name, path string) string {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p
		}
	}
	return ""
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// versionLess orders paths by the numbers in them, so that
// /usr/lib/postgresql/9.6/bin sorts before /usr/lib/postgresql/15/bin.
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := leadingDigits(a), leadingDigits(b)
		if da != "" && db != "" {
			na, _ := strconv.Atoi(da)
			nb, _ := strconv.Atoi(db)
			if na != nb {
				return na < nb
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func leadingDigits(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// clusterUser returns the OS user to run the cluster as: nil for the
// current one, or postgres if the process runs as root, which initdb and
// pg_ctl refuse.
func clusterUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(clusterUserName)
	if err != nil {
		return nil, fmt.Errorf("the process runs as root, which initdb refuses, and there is no OS user %s "+
			"to run the cluster as (%v); create one (e.g. useradd --system %s) or set DATABASE_URL",
			clusterUserName, err, clusterUserName)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("OS user %s: %w", clusterUserName, err)
	}
	return &osUser{name: u.Username, uid: uint32(uid), gid: uint32(gid)}, nil
}

// tempBase returns the directory to create the cluster's directory in: the
// system's temporary directory, unless the socket path would get too long
// for a Unix socket (about 100 bytes) or runAs could not reach it.
func tempBase(runAs *osUser) string {
	base := os.TempDir()
	if len(base) > 60 || (runAs != nil && !reachable(base, runAs)) {
		return "/tmp"
	}
	return base
}

// reachable reports whether u may enter dir, judging by the permission bits
// of dir and its parents.
func reachable(dir string, u *osUser) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return false
		}
		perm := st.Mode().Perm()
		if perm&0o001 == 0 && !(perm&0o100 != 0 && ownedBy(st, u)) {
			return false
		}
		if parent := filepath.Dir(d); parent == d {
			return true
		}
	}
}

// clusterConnString returns a URL for the database dbname of the throwaway
// clusters listening in the directories dirs, tried in that order, with
// the settings of params added.
func clusterConnString(dirs []string, dbname string, params url.Values) string {
	q := url.Values{"host": {strings.Join(dirs, ",")}, "port": {clusterPort}}
	for k, v := range params {
		q[k] = v
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(clusterUserName),
		Path:     "/" + dbname,
		RawQuery: q.Encode(),
	}
	return u.String()
}

// childEnv is the environment for PostgreSQL programs: this process's,
// without the PG* variables, which would change what they do.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

// confString quotes s as a string value in postgresql.conf.
func confString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}

// tail returns up to the last n bytes of the file at path.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(bytes.TrimSpace(b))
}

// A watchdog stops a cluster and removes its directory once this process
// has exited, however it exits: it is a shell that waits for end of file on
// a pipe whose writing end only this process holds. Close cancels it.
type watchdog struct {
	cmd *exec.Cmd
	w   *os.File
}

// watchdogScript runs as sh -c watchdogScript sh PG_CTL DATADIR DIR.
const watchdogScript = `read -r _
"$1" stop -D "$2" -m fast -w -t 60 >/dev/null 2>&1 || "$1" stop -D "$2" -m immediate -w -t 60 >/dev/null 2>&1
rm -rf "$3"`

// liveWatchdogs keeps the writing ends of the watchdogs' pipes reachable:
// a collected *os.File closes its descriptor, which would set the watchdog
// off while the cluster is in use.
var liveWatchdogs sync.Map // *os.File -> struct{}

// startWatchdog starts a watchdog for the cluster with data directory
// dataDir in dir.
func startWatchdog(pgCtl, dataDir, dir string, runAs *osUser, env []string) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "sh", pgCtl, dataDir, dir)
	cmd.Stdin = r
	cmd.Dir = "/"
	cmd.Env = env
	// A session of its own, so that the terminal's Ctrl-C, which ends this
	// process, does not end the watchdog too.
	cmd.SysProcAttr = sysProcAttr(runAs, true)
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	liveWatchdogs.Store(w, struct{}{})
	return &watchdog{cmd: cmd, w: w}, nil
}

// cancel ends the watchdog without letting it act.
func (wd *watchdog) cancel() {
	wd.cmd.Process.Kill()
	wd.cmd.Wait()
	liveWatchdogs.Delete(wd.w)
	wd.w.Close()
}
