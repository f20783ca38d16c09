package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// TestSilentConnectionFreesItsPlace: the server a claim's connection
// reached goes silent while the call runs (a primary cut off by a network
// partition, or gone while a proxy or a multi-host connection string
// already leads new connections elsewhere). Once the call has failed, the
// pool has that connection's place back at once, for a connection to a
// server that answers: with a pool of one, the next claim succeeds within
// the lock timeout instead of failing until pgx has given up closing the
// silent connection, 15 s later.
func TestSilentConnectionFreesItsPlace(t *testing.T) {
	link, through := pgtest.LinkTo(t, pgtest.NewDatabase(t))
	cfg, err := pgxpool.ParseConfig(through)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := postgres.New(pool)

	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	link.Sever()
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = c.Txn.Record(rctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")})
	cancel()
	if err == nil {
		t.Fatal("Record succeeded on a connection that no longer carries anything")
	}

	other := store.Scope{Tenant: key.Tenant, Method: key.Method, Key: "after"}
	start := time.Now()
	c, err = s.Claim(ctx, other, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("a claim after the silent connection's call failed: %+v, %v (after %v)", c, err, time.Since(start).Round(time.Millisecond))
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, other.Key).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows of the key recorded after the failure (%v), want 1", n, err)
	}
}
