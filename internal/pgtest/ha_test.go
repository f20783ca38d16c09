package pgtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestHAPartition starts an HA cluster with synchronous_mode, writes a
// key through HAProxy, and cuts the leader off: a new connection through
// HAProxy reaches another member, which took over with the key and takes
// writes; the old leader, cut off from etcd, has stopped taking them. Once
// healed, the old leader rejoins as a replica, and Close leaves no
// directory behind.
func TestHAPartition(t *testing.T) {
	c := NewHA(t, HAOptions{Synchronous: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	connString, err := c.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	insertKey(t, conn, "before")
	conn.Close(ctx)
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}

	cut := time.Now()
	if err := c.Partition(leader); err != nil {
		t.Fatal(err)
	}
	next, err := c.WaitWritable(ctx, leader)
	if err != nil {
		t.Fatalf("%v%s", err, c.Logs())
	}
	t.Logf("%s cut off; %s took writes through HAProxy %v later", leader, next, time.Since(cut).Round(time.Millisecond))
	conn, err = pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	insertKey(t, conn, "after")
	if n := countKeys(t, conn); n != 2 {
		t.Errorf("%d keys on the new leader, want 2", n)
	}
	conn.Close(ctx)
	// The old leader, reached directly: Patroni demoted it.
	old, _ := c.member(leader)
	err = c.poll(ctx, "demoted former leader", func(ctx context.Context) (bool, error) {
		conn, err := c.memberConn(ctx, old)
		if err != nil {
			return false, err
		}
		defer conn.Close(context.Background())
		var recovery bool
		err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovery)
		return recovery, err
	})
	if err != nil {
		t.Error(err)
	}

	if err := c.Heal(leader); err != nil {
		t.Fatal(err)
	}
	now, err := c.WaitHealthy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if now == leader {
		t.Errorf("%s leads again after the partition; want it a replica of %s", leader, next)
	}

	dirs := []string{c.dir}
	for _, m := range c.members {
		dirs = append(dirs, m.c.dir)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("directory %s still there after Close (%v)", d, err)
		}
	}
}

// TestHAMissing fails, before anything starts, with a message that names
// each missing program and how to install them.
func TestHAMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	dirs := defaultHADirs
	defaultHADirs = []string{t.TempDir()}
	defer func() { defaultHADirs = dirs }()
	_, err := StartHA(context.Background(), HAOptions{})
	if err == nil {
		t.Fatal("StartHA without Patroni, etcd or HAProxy succeeded")
	}
	for _, want := range []string{"patroni", "patronictl", "etcd", "haproxy", "apt-get install patroni etcd-server haproxy"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
