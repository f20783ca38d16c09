package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// optimistic runs one optimistic claim of k on s as a handler would: it
// writes a row of w for k in the claim's transaction and records out. It
// returns the record's error; the claim itself must own the key, since it
// reads nothing.
func optimistic(t *testing.T, ctx context.Context, s *postgres.Store, k store.Scope, fp string, out store.Outcome) error {
	t.Helper()
	c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte(fp), Optimistic: true})
	if err != nil || c.Txn == nil {
		return fmt.Errorf("optimistic claim: %+v, %w; want to own the key", c, err)
	}
	defer func() { _ = c.Txn.Release(ctx) }()
	tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
	if _, err := tx.Exec(ctx, `INSERT INTO w VALUES ($1)`, k.Key); err != nil {
		return fmt.Errorf("the handler's write: %w", err)
	}
	return c.Txn.Record(ctx, out)
}

// keyRows counts, through pool, the rows of w written for k and k's
// completed, unexpired rows, with the recorded body of the last.
func keyRows(t *testing.T, pool *pgxpool.Pool, k store.Scope) (writes, completed int, body string) {
	t.Helper()
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM w WHERE key = $3),
		count(*), coalesce(max(convert_from(response, 'UTF8')), '')
		FROM idempotency_keys WHERE tenant = $1 AND method = $2 AND key = $3
			AND status = 'recorded' AND expires_at > now()`, k.Tenant, k.Method, k.Key).Scan(&writes, &completed, &body)
	if err != nil {
		t.Fatal(err)
	}
	return writes, completed, body
}

func newWTable(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS w (key text)`); err != nil {
		t.Fatal(err)
	}
}

// TestOptimisticClaim runs optimistic claims against every state a key's
// row can be in: none, recorded, recorded with another fingerprint,
// expired, held by a live lease, and for a recorded error. A record that
// finds the row live must fail with store.ErrConflict and commit none of
// the handler's writes, leaving the row as it was for a claim in atomic
// mode to answer from.
func TestOptimisticClaim(t *testing.T) {
	pool := pgtest.NewPool(t)
	newWTable(t, pool)
	s := postgres.New(pool)
	ok := func(body string) store.Outcome { return store.Outcome{Code: code.Code_OK, Body: []byte(body)} }

	t.Run("first execution, then retries", func(t *testing.T) {
		k := store.Scope{Tenant: "t", Method: "/svc/M", Key: "first"}
		c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp"), Optimistic: true})
		if err != nil || c.Txn == nil {
			t.Fatalf("claim: %+v, %v", c, err)
		}
		if time.Until(c.ExpiresAt) < 23*time.Hour {
			t.Fatalf("expires at %v, want about 24h from now", c.ExpiresAt)
		}
		tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
		var timeout string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&timeout); err != nil || timeout != "0" {
			t.Fatalf("handler runs with lock_timeout %q (%v), want the session's 0", timeout, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO w VALUES ($1)`, k.Key); err != nil {
			t.Fatal(err)
		}
		if err := c.Txn.Record(ctx, ok("one")); err != nil {
			t.Fatal(err)
		}
		for _, fp := range []string{"fp", "other"} {
			if err := optimistic(t, ctx, s, k, fp, ok("two")); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("retry with fingerprint %s: %v, want ErrConflict", fp, err)
			}
		}
		if w, n, body := keyRows(t, pool, k); w != 1 || n != 1 || body != "one" {
			t.Fatalf("%d writes, %d completed rows recording %q; want 1, 1, \"one\"", w, n, body)
		}
		again, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
		if err != nil || again.Entry == nil || again.Entry.State != store.Recorded || string(again.Entry.Outcome.Body) != "one" {
			t.Fatalf("atomic claim after the conflict: %+v, %v; want the recorded entry", again, err)
		}
	})

	t.Run("recorded error", func(t *testing.T) {
		k := store.Scope{Tenant: "t", Method: "/svc/M", Key: "error"}
		bad := store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: []byte("bad")}
		if err := optimistic(t, ctx, s, k, "fp", bad); err != nil {
			t.Fatal(err)
		}
		if err := optimistic(t, ctx, s, k, "fp", bad); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("second recorded error: %v, want ErrConflict", err)
		}
		if w, n, body := keyRows(t, pool, k); w != 0 || n != 1 || body != "bad" {
			t.Fatalf("%d writes, %d completed rows recording %q; want 0, 1, \"bad\"", w, n, body)
		}
	})

	t.Run("expired row", func(t *testing.T) {
		// The record does not take the row over: the atomic claim that
		// follows the conflict does.
		k := store.Scope{Tenant: "t", Method: "/svc/M", Key: "expired"}
		if _, err := pool.Exec(ctx, insertExpiredRow, k.Tenant, k.Method, k.Key); err != nil {
			t.Fatal(err)
		}
		if err := optimistic(t, ctx, s, k, "fp", ok("fresh")); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("record over an expired row: %v, want ErrConflict", err)
		}
		if w, n, _ := keyRows(t, pool, k); w != 0 || n != 0 {
			t.Fatalf("%d writes, %d live completed rows; want none", w, n)
		}
		c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
		if err != nil || c.Txn == nil {
			t.Fatalf("atomic claim of the expired key: %+v, %v; want to own it", c, err)
		}
		if err := c.Txn.Record(ctx, ok("fresh")); err != nil {
			t.Fatal(err)
		}
		if _, n, body := keyRows(t, pool, k); n != 1 || body != "fresh" {
			t.Fatalf("%d completed rows recording %q; want 1, \"fresh\"", n, body)
		}
	})

	t.Run("live lease", func(t *testing.T) {
		k := store.Scope{Tenant: "t", Method: "/svc/M", Key: "leased"}
		l, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
		if err != nil || l.Lease == nil {
			t.Fatalf("lease: %+v, %v", l, err)
		}
		defer func() { _ = l.Lease.Release(ctx) }()
		if err := optimistic(t, ctx, s, k, "fp", ok("r")); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("record over a live lease: %v, want ErrConflict", err)
		}
		again, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
		if err != nil || again.Entry == nil || again.Entry.State != store.InProgress {
			t.Fatalf("atomic claim after the conflict: %+v, %v; want the lease in progress", again, err)
		}
		if w, n, _ := keyRows(t, pool, k); w != 0 || n != 0 {
			t.Fatalf("%d writes, %d completed rows; want none", w, n)
		}
	})
}

// TestOptimisticDuplicatesHaveOneWinner runs optimistic claims of one key
// at once, each writing a row: exactly one records and commits its write;
// every other record waits for the winner's commit (within the lock
// timeout) and fails with store.ErrConflict, committing nothing.
func TestOptimisticDuplicatesHaveOneWinner(t *testing.T) {
	const n = 8
	// A connection for each, since every handler writes before any
	// records.
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	newWTable(t, pool)
	s := postgres.New(pool, postgres.WithLockTimeout(time.Minute))
	for round := range 5 {
		k := store.Scope{Tenant: "t", Method: "/svc/M", Key: fmt.Sprint("dup-", round)}
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			errs    = make([]error, n)
			written sync.WaitGroup // every handler has written before any records
		)
		written.Add(n)
		for i := range n {
			wg.Go(func() {
				<-start
				c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp"), Optimistic: true})
				if err != nil || c.Txn == nil {
					errs[i] = fmt.Errorf("claim: %+v, %w", c, err)
					written.Done()
					return
				}
				defer func() { _ = c.Txn.Release(ctx) }()
				tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
				_, errs[i] = tx.Exec(ctx, `INSERT INTO w VALUES ($1)`, k.Key)
				written.Done()
				written.Wait()
				if errs[i] == nil {
					errs[i] = c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: fmt.Appendf(nil, "r%d", i)})
				}
			})
		}
		close(start)
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, store.ErrConflict):
				t.Fatalf("round %d, claim %d: %v, want nil or ErrConflict", round, i, err)
			}
		}
		if w, c, _ := keyRows(t, pool, k); won != 1 || w != 1 || c != 1 {
			t.Fatalf("round %d: %d records succeeded, %d writes and %d completed rows committed; want 1 each", round, won, w, c)
		}
	}
}

// optimisticRecordsGiveUpBehindTableLock holds lock on idempotency_keys on
// a connection of its own to lockDSN: an optimistic claim reads nothing,
// so it runs its handler, but its record must give up with store.ErrInUse
// after the lock timeout (twice: the first failure leaves pgx's statement
// cache invalidated) and commit none of the handler's writes; once the
// lock is gone the key is recorded once. pool must have the table w.
func optimisticRecordsGiveUpBehindTableLock(t *testing.T, s *postgres.Store, pool *pgxpool.Pool, lockDSN, lock string, lockTimeout time.Duration) {
	t.Helper()
	k := store.Scope{Tenant: "t", Method: "/svc/M", Key: "optimistic-behind-" + lock}
	release := holdTableLock(t, lockDSN, lock)
	for i := range 2 {
		// Far longer than the lock timeout: an unbounded wait ends here,
		// with context.DeadlineExceeded instead of ErrInUse.
		cctx, cancel := context.WithTimeout(ctx, 20*lockTimeout)
		err := optimistic(t, cctx, s, k, "fp", store.Outcome{Code: code.Code_OK, Body: []byte("r")})
		cancel()
		if !errors.Is(err, store.ErrInUse) {
			t.Fatalf("optimistic record %d behind the table lock: %v, want ErrInUse", i+1, err)
		}
	}
	release()
	if w, c, _ := keyRows(t, pool, k); w != 0 || c != 0 {
		t.Fatalf("records that gave up committed %d writes and %d completed keys, want none", w, c)
	}
	if err := optimistic(t, ctx, s, k, "fp", store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
		t.Fatalf("optimistic record once the lock is gone: %v", err)
	}
	if w, c, _ := keyRows(t, pool, k); w != 1 || c != 1 {
		t.Fatalf("%d writes and %d completed keys, want 1 each", w, c)
	}
}

// TestOptimisticRoundTrips counts the round trips of an optimistic claim
// and its record on one connection, in every QueryExecMode: the claim is
// the transaction's BEGIN alone, and a warm record is one round trip where
// pgx sends a batch whole, after a record that failed on a recorded key
// too.
func TestOptimisticRoundTrips(t *testing.T) {
	type trips [2]int64 // the claim, its record
	for _, tc := range []struct {
		mode        pgx.QueryExecMode
		first, warm trips
		// afterConflict is what a claim and its record cost after a
		// record that failed.
		afterConflict int64
	}{
		// The first record sets the lock timeout, prepares its three
		// statements under it, and sends the record with COMMIT.
		{pgx.QueryExecModeCacheStatement, trips{1, 5}, trips{1, 1}, 2},
		// pgx drops the descriptions of a failed batch, and describes
		// them again.
		{pgx.QueryExecModeCacheDescribe, trips{1, 3}, trips{1, 2}, 4},
		{pgx.QueryExecModeDescribeExec, trips{1, 3}, trips{1, 3}, 4},
		{pgx.QueryExecModeExec, trips{1, 1}, trips{1, 1}, 2},
		{pgx.QueryExecModeSimpleProtocol, trips{1, 1}, trips{1, 1}, 2},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			t.Parallel()
			pool, n := countingPool(t, pgtest.NewDatabase(t), tc.mode)
			s := postgres.New(pool)
			var got []trips
			for i := range 3 {
				k := store.Scope{Tenant: "t", Method: "/svc/M", Key: fmt.Sprint("k", i)}
				var (
					tr trips
					c  store.Claim
				)
				before := n.Load()
				c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp"), Optimistic: true})
				if err != nil || c.Txn == nil {
					t.Fatalf("claim: %+v, %v", c, err)
				}
				tr[0] = n.Load() - before
				before = n.Load()
				if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
					t.Fatal(err)
				}
				tr[1] = n.Load() - before
				got = append(got, tr)
			}
			// A record that fails on the key recorded last, and a claim and
			// record of a new key after it.
			k := store.Scope{Tenant: "t", Method: "/svc/M", Key: "k2"}
			c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp"), Optimistic: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("record of a recorded key: %v, want ErrConflict", err)
			}
			before := n.Load()
			k.Key = "after-the-conflict"
			if c, err = s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp"), Optimistic: true}); err != nil {
				t.Fatal(err)
			}
			if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
				t.Fatal(err)
			}
			after := n.Load() - before
			t.Logf("round trips of an optimistic claim and its record, three times: %v; after a conflict: %d", got, after)
			if after != tc.afterConflict {
				t.Errorf("a claim and record after a record that failed took %d round trips, want %d", after, tc.afterConflict)
			}
			if got[0] != tc.first {
				t.Errorf("the first claim and record took %v round trips, want %v", got[0], tc.first)
			}
			if got[2] != tc.warm {
				t.Errorf("warm claims and records took %v round trips, want %v", got[2], tc.warm)
			}
		})
	}
}

// TestRecordErrorOfAClaimNeverHandedOut: an error recorded on a claim whose
// transaction was never handed to a handler (Txn.Context was not called),
// as the engine records the error of a handler that failed under an
// optimistic claim, rolled back since, holds no write of a handler's to
// discard: it is recorded in the claim's own transaction, in one round
// trip, as a response is. One handed out is recorded in a transaction of
// its own, without the handler's write: a ROLLBACK and a batch.
func TestRecordErrorOfAClaimNeverHandedOut(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool, trips := countingPool(t, dsn, pgx.QueryExecModeExec)
	newWTable(t, pool)
	s := postgres.New(pool)
	for _, handed := range []bool{false, true} {
		k := store.Scope{Tenant: "t", Method: "/svc/M", Key: fmt.Sprint("handed-", handed)}
		c, err := s.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
		if err != nil || c.Txn == nil {
			t.Fatalf("claim of a new key: %+v, %v", c, err)
		}
		if handed {
			tx, _ := postgres.TxFromContext(c.Txn.Context(ctx))
			if _, err := tx.Exec(ctx, `INSERT INTO w VALUES ($1)`, k.Key); err != nil {
				t.Fatal(err)
			}
		}
		before := trips.Load()
		if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: []byte("bad")}); err != nil {
			t.Fatalf("handed out %v: %v", handed, err)
		}
		want := int64(1)
		if handed {
			want = 2
		}
		if n := trips.Load() - before; n != want {
			t.Errorf("handed out %v: recording the error took %d round trips, want %d", handed, n, want)
		}
		if writes, completed, body := keyRows(t, pool, k); writes != 0 || completed != 1 || body != "bad" {
			t.Errorf("handed out %v: %d writes, %d completed rows with body %q; want 0, 1, %q", handed, writes, completed, body, "bad")
		}
	}
}
