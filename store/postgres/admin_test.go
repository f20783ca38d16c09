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
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// settledStatus is the error the tests settle keys with.
var settledStatus = &spb.Status{Code: int32(code.Code_FAILED_PRECONDITION), Message: "settled by an operator"}

// TestAdminBehindLockedKeyRowIsBounded: Forget and Settle of a key whose
// row another session holds locked (an operator's script, a migration's
// UPDATE) give up with store.ErrInUse after the lock timeout, forced (of
// a live lease) or not (of an abandoned one, which they would write), and
// change nothing; Key, which locks nothing, answers meanwhile. Once the
// session is gone they take effect. In every QueryExecMode.
func TestAdminBehindLockedKeyRowIsBounded(t *testing.T) {
	const lockTimeout = 300 * time.Millisecond
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			dsn := pgtest.NewDatabase(t)
			pool := newPool(t, dsn, mode)
			var (
				mu  sync.Mutex
				now = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
			)
			clock := func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				return now
			}
			s := postgres.New(pool, postgres.WithLockTimeout(lockTimeout), postgres.WithClock(clock))
			settled := store.Scope{Tenant: "t", Method: "/svc/M", Key: "settled"}
			forgotten := store.Scope{Tenant: "t", Method: "/svc/M", Key: "forgotten"}
			var leases []store.Lease
			for _, k := range []store.Scope{settled, forgotten} {
				l, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
				if err != nil || l.Lease == nil {
					t.Fatalf("lease of %s: %+v, %v", k.Key, l, err)
				}
				leases = append(leases, l.Lease)
			}
			release := holdKeyRow(t, dsn, `SELECT FROM idempotency_keys WHERE tenant = $1 AND method = $2 AND key IN ($3, $4) FOR UPDATE`,
				settled.Tenant, settled.Method, settled.Key, forgotten.Key)

			for _, force := range []bool{true, false} {
				if !force {
					// Unforced, of abandoned leases.
					mu.Lock()
					now = now.Add(2 * time.Minute)
					mu.Unlock()
				}
				for _, w := range []struct {
					name  string
					write func(ctx context.Context) error
				}{
					{"settle", func(ctx context.Context) error {
						return s.Settle(ctx, settled, settledStatus, store.SettleOptions{Force: force})
					}},
					{"forget", func(ctx context.Context) error { return s.Forget(ctx, forgotten, store.ForgetOptions{Force: force}) }},
				} {
					// Far longer than the lock timeout: an unbounded wait
					// ends here, with context.DeadlineExceeded.
					cctx, cancel := context.WithTimeout(ctx, 20*lockTimeout)
					err := w.write(cctx)
					cancel()
					if !errors.Is(err, store.ErrInUse) {
						t.Errorf("%s (force %v) behind the locked key row: %v, want ErrInUse", w.name, force, err)
					}
				}
			}
			for _, k := range []store.Scope{settled, forgotten} {
				cctx, cancel := context.WithTimeout(ctx, 20*lockTimeout)
				ki, err := s.Key(cctx, k)
				cancel()
				if err != nil || ki.State != store.Abandoned {
					t.Errorf("Key(%s) behind the locked row: %+v, %v; want it abandoned", k.Key, ki, err)
				}
			}

			release()
			if err := s.Settle(ctx, settled, settledStatus, store.SettleOptions{}); err != nil {
				t.Fatalf("Settle once the row is free: %v", err)
			}
			if err := s.Forget(ctx, forgotten, store.ForgetOptions{}); err != nil {
				t.Fatalf("Forget once the row is free: %v", err)
			}
			for _, l := range leases {
				if err := l.Record(ctx, store.Outcome{Code: code.Code_OK}); !errors.Is(err, store.ErrLeaseLost) {
					t.Errorf("the fenced holder's Record: %v, want ErrLeaseLost", err)
				}
			}
			if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND status = 'recorded' AND response_code = $2`,
				settled.Key, settledStatus.GetCode()); n != 1 {
				t.Errorf("%d rows of the settled key with its outcome, want 1", n)
			}
			if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, forgotten.Key); n != 0 {
				t.Errorf("%d rows of the forgotten key, want none", n)
			}
		})
	}
}

// TestAdminCorruptRow: a row whose steps cannot be read fails Key and the
// page that holds it with store.ErrCorrupt, naming the key, and can still
// be forgotten, after which the listing works again.
func TestAdminCorruptRow(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	k := store.Scope{Tenant: "t", Method: "/svc/M", Key: "damaged"}
	l, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || l.Lease == nil {
		t.Fatalf("lease: %+v, %v", l, err)
	}
	if err := l.Lease.SaveStep(ctx, store.Step{Name: "charge"}); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `UPDATE idempotency_keys SET step_results = NULL, step_names = ARRAY['a', 'b'] WHERE key = $1`, k.Key)

	if _, err := s.Key(ctx, k); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Key of a damaged row: %v, want ErrCorrupt", err)
	}
	_, _, err = s.Keys(ctx, store.KeyFilter{Tenant: k.Tenant})
	if !errors.Is(err, store.ErrCorrupt) || !containsAll(err.Error(), `"damaged"`) {
		t.Errorf("Keys with a damaged row: %v, want ErrCorrupt naming the key", err)
	}
	if err := s.Forget(ctx, k, store.ForgetOptions{Force: true}); err != nil {
		t.Fatalf("Forget of a damaged row: %v", err)
	}
	if list, _, err := s.Keys(ctx, store.KeyFilter{Tenant: k.Tenant}); err != nil || len(list) != 0 {
		t.Errorf("Keys after Forget: %+v, %v; want none", list, err)
	}
}

// TestShardedKeys: a listing of every tenant merges the shards' pages in
// one order, and its cursor leads from one shard's keys to the other's;
// a listing of one tenant asks that tenant's shard alone.
func TestShardedKeys(t *testing.T) {
	s, a, b := twoShards(t)
	var want []store.Scope
	for i := range 4 {
		for _, tenant := range []string{alpha, beta} {
			k := store.Scope{Tenant: tenant, Method: "/svc/M", Key: fmt.Sprint("k-", i)}
			claimAndWrite(t, s, k, "r")
			want = append(want, k)
		}
	}
	if keysOf(t, a, beta) != 0 || keysOf(t, b, alpha) != 0 {
		t.Fatal("a tenant's keys are on the other's shard")
	}
	var (
		got   []store.Scope
		after string
	)
	for range 2 * len(want) {
		page, next, err := s.Keys(ctx, store.KeyFilter{AllTenants: true, Limit: 3, After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, ki := range page {
			got = append(got, ki.Scope)
		}
		if after = next; after == "" {
			break
		}
	}
	// Claimed one after the other: creation order is the order of want.
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("every tenant's keys, 3 a page:\n%v\nwant\n%v", got, want)
	}

	// One tenant's listing never touches the other shard.
	dark, accepted := blackholePool(t)
	half := postgres.NewSharded([]*pgxpool.Pool{a, dark}, byName, postgres.WithLockTimeout(500*time.Millisecond))
	var (
		page []store.KeyInfo
		err  error
	)
	within(t, 30*time.Second, "Keys of alpha", func() { page, _, err = half.Keys(ctx, store.KeyFilter{Tenant: alpha}) })
	if err != nil || len(page) != 4 {
		t.Errorf("Keys of alpha with beta's shard dark: %d keys, %v; want 4", len(page), err)
	}
	if n := accepted(); n != 0 {
		t.Errorf("Keys of alpha opened %d connections to beta's shard", n)
	}
	within(t, 30*time.Second, "Keys of every tenant", func() { _, _, err = half.Keys(ctx, store.KeyFilter{AllTenants: true}) })
	if err == nil || !containsAll(err.Error(), "shard 1") {
		t.Errorf("Keys of every tenant with shard 1 dark: %v, want an error naming shard 1", err)
	}
	if _, _, err := half.Keys(ctx, store.KeyFilter{Tenant: nowhere}); !errors.Is(err, postgres.ErrNoShard) {
		t.Errorf("Keys of a tenant without a shard: %v, want ErrNoShard", err)
	}
}

// TestAdminWriteMeetsATakeoverItWaitedFor: an unforced Forget or Settle
// of an abandoned lease whose row a takeover holds, not yet committed,
// waits for it and then reads the row as the takeover left it: the lease
// is live, so the write is refused with a *store.LeaseLiveError and the
// new holder's row stays. A look before the write would have seen the
// lease run out, and overridden the new holder.
func TestAdminWriteMeetsATakeoverItWaitedFor(t *testing.T) {
	for _, action := range []string{"forget", "settle"} {
		t.Run(action, func(t *testing.T) {
			t.Parallel()
			dsn := pgtest.NewDatabase(t)
			pool := newPool(t, dsn, pgx.QueryExecModeExec)
			start := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
			var (
				mu  sync.Mutex
				now = start
			)
			s := postgres.New(pool, postgres.WithLockTimeout(time.Minute), postgres.WithClock(func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				return now
			}))
			k := store.Scope{Tenant: "t", Method: "/svc/M", Key: "k"}
			if l, err := s.ClaimLeased(ctx, k, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Second}); err != nil || l.Lease == nil {
				t.Fatalf("lease: %+v, %v", l, err)
			}
			mu.Lock()
			now = now.Add(time.Minute) // the lease ran out
			mu.Unlock()

			// The takeover, as a claim in flight would write it.
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rollbackAndClose(conn))
			until := start.Add(time.Hour)
			if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `UPDATE idempotency_keys SET locked_until = $2, fencing_token = 7, takeovers = takeovers + 1 WHERE key = $1`,
				k.Key, until); err != nil {
				t.Fatal(err)
			}

			done := make(chan error, 1)
			go func() {
				if action == "forget" {
					done <- s.Forget(ctx, k, store.ForgetOptions{})
				} else {
					done <- s.Settle(ctx, k, settledStatus, store.SettleOptions{})
				}
			}()
			// Wait until the write is blocked on the takeover's row.
			waitForLockWait(t, pool, action)
			if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
				t.Fatal(err)
			}
			var live *store.LeaseLiveError
			if err := <-done; !errors.As(err, &live) || !live.Until.Equal(until) {
				t.Fatalf("%s behind a takeover: %v, want a *store.LeaseLiveError until %v", action, err, until)
			}
			if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND status = 'in_progress' AND fencing_token = 7`, k.Key); n != 1 {
				t.Errorf("%d rows of the new holder, want 1", n)
			}
		})
	}
}
