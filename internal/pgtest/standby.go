package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// replicationTimeout bounds waiting for the standby to stream from the
// primary, and for a promoted standby to accept writes.
const replicationTimeout = time.Minute

// standbySlot is the physical replication slot the primary keeps for the
// standby, so that no WAL the standby still needs is recycled.
const standbySlot = "idem_pgtest_standby"

// ReplicationOptions configures [StartReplicated].
type ReplicationOptions struct {
	// Synchronous makes the primary wait, before it acknowledges a commit,
	// until the standby has flushed the commit's WAL
	// (synchronous_standby_names = '*', synchronous_commit = on). Without
	// it the standby streams asynchronously: a commit is acknowledged once
	// it is on the primary's disk.
	Synchronous bool
}

// Replicated is a throwaway primary and a streaming standby of it, each a
// cluster of its own in a temporary directory (see [StartReplicated]).
type Replicated struct {
	// Primary is the primary, on which databases are created.
	Primary *Server
	// Standby is the standby: it serves reads until [Replicated.Promote]
	// makes it the primary.
	Standby *Server

	opts ReplicationOptions

	mu       sync.Mutex
	killed   bool
	promoted bool
}

// StartReplicated starts a throwaway primary and a standby made from it
// with pg_basebackup, which streams the primary's WAL through a
// replication slot, synchronously or not as opts say; it returns once the
// standby streams. Like [StartCluster] it ignores DATABASE_URL and the
// libpq defaults, and needs the server binaries (pg_basebackup too). The
// caller must call [Replicated.Close], which stops both and removes their
// directories.
//
// Both listen only on Unix sockets in their own directories, on the same
// port number; [Replicated.CreateDatabase] returns a connection string
// that names both hosts, as a client of a primary with a standby does.
// [Replicated.KillPrimary] and [Replicated.Promote] fail the primary over.
// It is for idem's own failover tests.
func StartReplicated(ctx context.Context, opts ReplicationOptions) (*Replicated, error) {
	r, err := startReplicated(ctx, defaultDiscovery(), opts)
	if err != nil {
		return nil, fmt.Errorf("start a throwaway PostgreSQL primary and standby: %w\n%s", err, howToGetServerBinaries)
	}
	return r, nil
}

func startReplicated(ctx context.Context, d discovery, opts ReplicationOptions) (*Replicated, error) {
	binDir, err := d.findBinDir(ctx)
	if err != nil {
		return nil, err
	}
	if !isExecutable(filepath.Join(binDir, "pg_basebackup")) {
		return nil, fmt.Errorf("no pg_basebackup in %s, next to initdb; a standby is made with it", binDir)
	}
	var settings []string
	if opts.Synchronous {
		settings = []string{"synchronous_standby_names = '*'", "synchronous_commit = on"}
	}
	primary, err := d.startCluster(ctx, settings...)
	if err != nil {
		return nil, err
	}
	r := &Replicated{opts: opts}
	ok := false
	defer func() {
		if !ok {
			r.close(primary)
		}
	}()
	if r.Primary, err = openServer(ctx, primary.connString, "a throwaway primary in "+primary.dir, urlProbeTimeout); err != nil {
		return nil, err
	}
	r.Primary.cluster = primary

	standby, err := d.newCluster(ctx)
	if err != nil {
		return nil, err
	}
	r.Standby = &Server{cluster: standby, closed: make(chan struct{})} // stops it if what follows fails
	// -R writes primary_conninfo and primary_slot_name into the standby's
	// postgresql.auto.conf and creates standby.signal.
	if _, err := standby.run(ctx, initdbTimeout, standby.bin("pg_basebackup"),
		"-D", standby.dataDir, "-h", primary.dir, "-p", clusterPort, "-U", clusterUserName,
		"-X", "stream", "-c", "fast", "-C", "-S", standbySlot, "-R"); err != nil {
		return nil, err
	}
	// The standby's postgresql.conf is the primary's copy: its socket goes
	// to its own directory, and once promoted it has no standby to wait for.
	// A standby that lost its stream waits wal_retrieve_retry_interval (5 s
	// by default) before it looks for WAL again, and a promotion requested
	// meanwhile (PostgreSQL 15) waits with it.
	if err := standby.configure("synchronous_standby_names = ''", "wal_retrieve_retry_interval = '100ms'"); err != nil {
		return nil, err
	}
	standby.started = true
	if err := standby.start(ctx); err != nil {
		return nil, err
	}
	s, err := openServer(ctx, standby.connString, "a throwaway standby in "+standby.dir, urlProbeTimeout)
	if err != nil {
		return nil, err
	}
	s.cluster = standby
	r.Standby = s
	if err := r.waitStreaming(ctx); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// waitStreaming waits until the primary reports the standby streaming, and,
// for synchronous replication, as its synchronous standby.
func (r *Replicated) waitStreaming(ctx context.Context) error {
	want := "async"
	if r.opts.Synchronous {
		want = "sync"
	}
	ctx, cancel := context.WithTimeout(ctx, replicationTimeout)
	defer cancel()
	for {
		var n int
		err := r.Primary.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE state = 'streaming' AND sync_state = $1`, want).Scan(&n)
		if err == nil && n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the standby is not streaming (%s) after %v (%v); standby log:\n%s",
				want, replicationTimeout, err, tail(r.Standby.cluster.logFile, 2000))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CreateDatabase creates a database on the primary, as
// [Server.CreateDatabase] does, and returns a connection string for it that
// names the primary and then the standby, with target_session_attrs =
// read-write: a client connects to whichever of them accepts writes, the
// standby once it has been promoted. It returns once the standby has
// replayed the database's creation. The database goes when the clusters
// do, at [Replicated.Close].
func (r *Replicated) CreateDatabase(ctx context.Context) (string, error) {
	connString, _, err := r.Primary.CreateDatabase(ctx)
	if err != nil {
		return "", err
	}
	if err := r.waitReplayed(ctx); err != nil {
		return "", err
	}
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return "", fmt.Errorf("parse connection string: %w", err)
	}
	dirs := []string{r.Primary.cluster.dir, r.Standby.cluster.dir}
	return clusterConnString(dirs, cfg.Database, url.Values{"target_session_attrs": {"read-write"}}), nil
}

// waitReplayed waits until the standby has replayed the primary's WAL as
// far as it went when waitReplayed was called.
func (r *Replicated) waitReplayed(ctx context.Context) error {
	var lsn string
	if err := r.Primary.admin.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, replicationTimeout)
	defer cancel()
	for {
		var done bool
		err := r.Standby.admin.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn).Scan(&done)
		if err == nil && done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the standby has not replayed the primary's WAL up to %s after %v (%v)", lsn, replicationTimeout, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// KillPrimary kills the primary as a crash of its machine would: SIGKILL to
// the postmaster and every process of its process group (pg_ctl starts
// the postmaster in a session of its own), at once, so that no backend
// finishes a commit and no WAL sender sends another byte. It returns once
// the postmaster is gone. The primary's directory stays until
// [Replicated.Close]; it is not started again.
func (r *Replicated) KillPrimary() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.killed {
		return errors.New("pgtest: the primary was killed already")
	}
	c := r.Primary.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("pgtest: the primary was stopped")
	}
	pid, err := postmasterPID(c.dataDir)
	if err != nil {
		return err
	}
	if err := killGroup(pid); err != nil {
		return fmt.Errorf("pgtest: kill the primary's postmaster %d: %w", pid, err)
	}
	r.killed = true
	// Nothing for pg_ctl stop to stop any more: Close only removes the
	// directory.
	c.started = false
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	r.Primary.admin.Reset()
	return nil
}

// postmasterPID reads the postmaster's process id from the first line of
// postmaster.pid in dataDir.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: read the postmaster's pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pgtest: postmaster.pid starts with %q, not a process id", line)
	}
	return pid, nil
}

// Promote promotes the standby (pg_ctl promote) and returns once it accepts
// writes: it is then the primary, and the connection string of
// [Replicated.CreateDatabase] reaches it. Kill the primary first: pgtest
// does not fence an old primary that still runs.
func (r *Replicated) Promote(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.promoted {
		return errors.New("pgtest: the standby was promoted already")
	}
	c := r.Standby.cluster
	if _, err := c.run(ctx, pgCtlTimeout, c.pgCtl, "promote", "-D", c.dataDir, "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pgtest: promote the standby: %w\nstandby log:\n%s", err, tail(c.logFile, 2000))
	}
	r.promoted = true
	ctx, cancel := context.WithTimeout(ctx, replicationTimeout)
	defer cancel()
	for {
		var readOnly bool
		err := r.Standby.admin.QueryRow(ctx, `SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool`).Scan(&readOnly)
		if err == nil && !readOnly {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: the promoted standby does not accept writes (%v)", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// DetachStandby stops the standby's replication (its primary_conninfo is
// cleared and its configuration reloaded) and returns once its WAL
// receiver has stopped. From then on the standby falls behind by every
// commit the primary makes: a promotion loses them, as an asynchronous
// standby that lags does. Under synchronous replication the primary's
// commits wait for a standby that no longer comes.
func (r *Replicated) DetachStandby(ctx context.Context) error {
	s := r.Standby
	if _, err := s.admin.Exec(ctx, `ALTER SYSTEM SET primary_conninfo = ''`); err != nil {
		return fmt.Errorf("pgtest: detach the standby: %w", err)
	}
	if _, err := s.admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("pgtest: detach the standby: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, replicationTimeout)
	defer cancel()
	for {
		var n int
		err := s.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver`).Scan(&n)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: the standby's WAL receiver still runs (%v)", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Close stops both clusters and removes their directories. It may be
// called more than once.
func (r *Replicated) Close() error {
	return r.close(nil)
}

// close closes what r holds; primary is the primary's cluster when r.Primary
// was not opened yet.
func (r *Replicated) close(primary *cluster) error {
	var errs []error
	if r.Standby != nil {
		if r.Standby.admin == nil { // not opened: only the cluster
			errs = append(errs, r.Standby.cluster.stop())
		} else {
			errs = append(errs, r.Standby.Close())
		}
	}
	if r.Primary != nil {
		errs = append(errs, r.Primary.Close())
	} else if primary != nil {
		errs = append(errs, primary.stop())
	}
	return errors.Join(errs...)
}

// NewReplicated starts a throwaway primary with a streaming standby
// ([StartReplicated]) for tb, creates a database on them and returns them
// with its multi-host connection string ([Replicated.CreateDatabase]). Both
// clusters are stopped when tb has finished. It fails tb, never skips it,
// when they cannot be started; under go test -short it skips tb, as
// [NewDatabase] does.
func NewReplicated(tb testing.TB, opts ReplicationOptions) (*Replicated, string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("pgtest: starts PostgreSQL with a standby, so it runs without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := StartReplicated(ctx, opts)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := r.Close(); err != nil {
			tb.Errorf("pgtest: stop the primary and its standby: %v", err)
		}
	})
	connString, err := r.CreateDatabase(ctx)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return r, connString
}
