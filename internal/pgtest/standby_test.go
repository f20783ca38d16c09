package pgtest

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestReplicated starts a primary with a synchronous standby, writes a key
// through the multi-host connection string, kills the primary and promotes
// the standby: the key is there, the same connection string reaches the
// new primary and writes on it, and Close leaves no directory behind.
func TestReplicated(t *testing.T) {
	r, connString := NewReplicated(t, ReplicationOptions{Synchronous: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, fb := range append([]*pgconn.FallbackConfig{{Host: cfg.Host}}, cfg.Fallbacks...) {
		if !slices.Contains(hosts, fb.Host) {
			hosts = append(hosts, fb.Host)
		}
	}
	if !slices.Equal(hosts, []string{r.Primary.cluster.dir, r.Standby.cluster.dir}) || cfg.ValidateConnect == nil {
		t.Fatalf("connection string %q does not name the primary and then the standby, read-write", connString)
	}
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	insertKey(t, pool, "before")
	var recovery bool
	if err := r.Standby.admin.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery); err != nil || !recovery {
		t.Fatalf("standby in recovery: %v, %v; want true", recovery, err)
	}

	if err := r.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	// Until the promotion, no host takes writes, so nothing connects.
	if conn, err := pgx.Connect(ctx, connString); err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a read-write server with the primary dead and the standby not promoted")
	} else if !strings.Contains(err.Error(), "read only") {
		t.Fatalf("connecting with the primary dead: %v, want the standby refused as read-only", err)
	}
	if err := r.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Reset()
	insertKey(t, pool, "after")
	rows, _ := pool.Query(ctx, "SELECT key FROM idempotency_keys ORDER BY key")
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "after,before" {
		t.Fatalf("keys on the new primary %v, want [after before]", keys)
	}
	pool.Close()

	dirs := []string{r.Primary.cluster.dir, r.Standby.cluster.dir}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cluster directory %s still there after Close (%v)", d, err)
		}
	}
}

// TestDetachStandby detaches an asynchronous standby, commits on the
// primary and fails over: the commit made after the detach is lost, the one
// before it is not.
func TestDetachStandby(t *testing.T) {
	r, connString := NewReplicated(t, ReplicationOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	insertKey(t, pool, "replicated")
	// Asynchronous means later: wait until the standby has it.
	if err := r.waitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.DetachStandby(ctx); err != nil {
		t.Fatal(err)
	}
	insertKey(t, pool, "lost")
	if err := r.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	if err := r.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Reset()
	rows, _ := pool.Query(ctx, "SELECT key FROM idempotency_keys ORDER BY key")
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "replicated" {
		t.Fatalf("keys on the new primary %v, want [replicated]", keys)
	}
}

// TestReplicatedNoBaseBackup fails, before initdb runs, with a message that
// names pg_basebackup when the server binaries lack it.
func TestReplicatedNoBaseBackup(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if err := os.WriteFile(bin+"/"+name, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", t.TempDir())
	d := discovery{binGlobs: []string{bin}}
	_, err := startReplicated(context.Background(), d, ReplicationOptions{})
	if err == nil || !strings.Contains(err.Error(), "no pg_basebackup in "+bin) {
		t.Fatalf("start without pg_basebackup: %v, want an error that names it", err)
	}
}
