package postgres_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestLeaseTakeoverFencesTheEarlierOwner(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	first, err := s.Lease(ctx, key, store.Request{Fingerprint: []byte("fp")}, 300*time.Millisecond)
	if err != nil || first.Lease == nil {
		t.Fatalf("first lease: %+v, %v", first, err)
	}
	if err := first.Lease.SaveRecoveryPoint(ctx, store.RecoveryPoint{Step: "charge_sent", Data: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}

	// Live lease: no takeover, and the entry says how long it still runs.
	live, err := s.Lease(ctx, key, store.Request{Fingerprint: []byte("fp")}, time.Minute)
	if err != nil || live.Entry == nil || live.Entry.State != store.InProgress {
		t.Fatalf("claim during a live lease: %+v, %v", live, err)
	}
	if r := live.Entry.LeaseRemaining; r <= 0 || r > 300*time.Millisecond {
		t.Fatalf("LeaseRemaining = %v, want in (0, 300ms]", r)
	}

	time.Sleep(400 * time.Millisecond)
	// Run out, but another fingerprint: never taken over.
	other, err := s.Lease(ctx, key, store.Request{Fingerprint: []byte("other")}, time.Minute)
	if err != nil || other.Entry == nil {
		t.Fatalf("claim with another fingerprint: %+v, %v", other, err)
	}
	second, err := s.Lease(ctx, key, store.Request{Fingerprint: []byte("fp")}, time.Minute)
	if err != nil || second.Lease == nil {
		t.Fatalf("takeover: %+v, %v", second, err)
	}
	p, ok := second.Lease.RecoveryPoint()
	if !ok || p.Step != "charge_sent" || string(p.Data) != "ch_1" {
		t.Fatalf("recovery point after takeover = %+v, %v", p, ok)
	}

	for name, err := range map[string]error{
		"extend":   first.Lease.Extend(ctx, time.Minute),
		"save":     first.Lease.SaveRecoveryPoint(ctx, store.RecoveryPoint{Step: "x"}),
		"complete": first.Lease.Complete(ctx, store.Outcome{Code: codes.OK, Body: []byte("stale")}),
	} {
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("stale %s: %v, want ErrLeaseLost", name, err)
		}
	}
	if err := second.Lease.Complete(ctx, store.Outcome{Code: codes.OK, Body: []byte("mine")}); err != nil {
		t.Fatal(err)
	}
	var body []byte
	if err := pool.QueryRow(ctx, `SELECT response FROM idempotency_keys`).Scan(&body); err != nil || string(body) != "mine" {
		t.Fatalf("recorded %q, %v", body, err)
	}
}
