package postgres_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

func TestLeaseTakeoverFencesTheEarlierOwner(t *testing.T) {
	pool := pgtest.NewPool(t)
	clock := newTestClock()
	s := postgres.New(pool, postgres.WithClock(clock.Now))
	first, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: 300 * time.Millisecond})
	if err != nil || first.Lease == nil {
		t.Fatalf("first lease: %+v, %v", first, err)
	}
	if err := first.Lease.SaveStep(ctx, store.Step{Name: "charge_sent", Result: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}

	// Live lease: no takeover, and the entry says how long it still runs.
	live, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || live.Entry == nil || live.Entry.State != store.InProgress {
		t.Fatalf("claim during a live lease: %+v, %v", live, err)
	}
	if r := live.Entry.LeaseRemaining; r <= 0 || r > 300*time.Millisecond {
		t.Fatalf("LeaseRemaining = %v, want in (0, 300ms]", r)
	}

	clock.Add(400 * time.Millisecond)
	// Run out, but another fingerprint: never taken over.
	other, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("other"), Lease: time.Minute})
	if err != nil || other.Entry == nil {
		t.Fatalf("claim with another fingerprint: %+v, %v", other, err)
	}
	second, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || second.Lease == nil {
		t.Fatalf("takeover: %+v, %v", second, err)
	}
	if steps := second.Lease.Steps(); len(steps) != 1 || steps[0].Name != "charge_sent" || string(steps[0].Result) != "ch_1" {
		t.Fatalf("steps after takeover = %+v", steps)
	}

	for name, err := range map[string]error{
		"extend": first.Lease.Extend(ctx, time.Minute),
		"save":   first.Lease.SaveStep(ctx, store.Step{Name: "x"}),
		"record": first.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("stale")}),
	} {
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("stale %s: %v, want ErrLeaseLost", name, err)
		}
	}
	if err := second.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("mine")}); err != nil {
		t.Fatal(err)
	}
	var body []byte
	if err := pool.QueryRow(ctx, `SELECT response FROM idempotency_keys`).Scan(&body); err != nil || string(body) != "mine" {
		t.Fatalf("recorded %q, %v", body, err)
	}
}

// TestLeaseOfUnreadableStepsIsCorrupt: a key whose saved steps cannot be
// decoded is refused with store.ErrCorrupt, by every claim (the lease the
// takeover took is ended at once, so the next claim does not find the key
// in use), and only such a key: a claim that fails for another reason is
// not.
func TestLeaseOfUnreadableStepsIsCorrupt(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	first, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || first.Lease == nil {
		t.Fatalf("first lease: %+v, %v", first, err)
	}
	if err := first.Lease.SaveStep(ctx, store.Step{Name: "charge", Result: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}
	// The steps are damaged, and the worker dies: its lease runs out.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET step_names = '{charge,NULL}', step_results = '{ch_1,ch_2}', locked_until = now()`); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
		if !errors.Is(err, store.ErrCorrupt) || c.Lease != nil || c.Entry != nil {
			t.Fatalf("claim %d of a key with unreadable steps: %+v, %v; want store.ErrCorrupt", i+1, c, err)
		}
	}
	// Another request under the key is still told it is another request.
	c, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("other"), Lease: time.Minute})
	if err != nil || c.Entry == nil {
		t.Fatalf("claim with another fingerprint: %+v, %v; want the entry", c, err)
	}
	// A failure of another kind is not corruption.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.ClaimLeased(cctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute}); err == nil || errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("claim with an ended context: %v, want its error, not store.ErrCorrupt", err)
	}
}

// TestFencedLeaseKnowsItIsFenced: once a write of a lease found it lost,
// the lease reports store.ErrLeaseLost to every later write without asking
// the database again (here, a closed pool would answer otherwise).
func TestFencedLeaseKnowsItIsFenced(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	c, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || c.Lease == nil {
		t.Fatalf("lease: %+v, %v", c, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET fencing_token = fencing_token + 1`); err != nil {
		t.Fatal(err)
	}
	if err := c.Lease.Extend(ctx, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Extend of a taken-over lease: %v, want ErrLeaseLost", err)
	}
	pool.Close()
	for name, err := range map[string]error{
		"extend": c.Lease.Extend(ctx, time.Minute),
		"save":   c.Lease.SaveStep(ctx, store.Step{Name: "x"}),
	} {
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("%s after the lease was found lost: %v, want ErrLeaseLost", name, err)
		}
	}
}

// TestStepsAndMetadataLandInArrays: a lease's steps are written to
// step_names and step_results, and a kept call's metadata to
// request_header_names and request_header_values, which an operator can
// query; the previous version's columns are left empty. In every
// QueryExecMode, since pgx encodes the arrays differently in each.
func TestStepsAndMetadataLandInArrays(t *testing.T) {
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			stepsAndMetadataLandInArrays(t, newPool(t, pgtest.NewDatabase(t), mode))
		})
	}
}

func stepsAndMetadataLandInArrays(t *testing.T, pool *pgxpool.Pool) {
	s := postgres.New(pool)
	kept := &store.Call{Method: "/svc/Charge", Request: []byte("req"),
		Metadata: map[string][]string{"x-user": {"u-7"}, "x-roles": {"a", "b"}}}
	lc, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Call: kept, Lease: time.Minute})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease: %+v, %v", lc, err)
	}
	for _, p := range []store.Step{{Name: "reserve", Result: []byte("r1")}, {Name: "charge"}, {Name: "reserve", Result: []byte("r2")}} {
		if err := lc.Lease.SaveStep(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	var (
		names, headerNames    []string
		results, headerValues [][]byte
	)
	err = pool.QueryRow(ctx, `SELECT step_names, step_results, request_header_names, request_header_values FROM idempotency_keys`).
		Scan(&names, &results, &headerNames, &headerValues)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"reserve", "charge"}) || len(results) != 2 ||
		string(results[0]) != "r2" || results[1] != nil {
		t.Errorf("step_names %q, step_results %q; want reserve=r2 and charge with no data (NULL)", names, results)
	}
	if !slices.Equal(headerNames, []string{"x-roles", "x-roles", "x-user"}) || !slices.EqualFunc(headerValues, []string{"a", "b", "u-7"}, func(b []byte, s string) bool { return string(b) == s }) {
		t.Errorf("request_header_names %q, request_header_values %q; want x-roles=a, x-roles=b, x-user=u-7", headerNames, headerValues)
	}
	// What the arrays hold is what a takeover reads.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now()`); err != nil {
		t.Fatal(err)
	}
	second, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
	if err != nil || second.Lease == nil {
		t.Fatalf("takeover: %+v, %v", second, err)
	}
	if got, want := second.Lease.Steps(), []store.Step{{Name: "reserve", Result: []byte("r2")}, {Name: "charge"}}; !sameSteps(got, want) {
		t.Errorf("steps after the takeover %v, want %v", got, want)
	}
	if err := second.Lease.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys
		WHERE request_header_names IS NULL AND request_header_values IS NULL AND request_method IS NULL`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("%d rows without the kept request after the record (%v), want 1", left, err)
	}
}

// TestLeaseOfUnpairedStepArraysIsCorrupt: step arrays that do not pair up
// (damaged outside idem) make the key's steps unreadable, as a damaged
// list of the previous version's does.
func TestLeaseOfUnpairedStepArraysIsCorrupt(t *testing.T) {
	for name, damage := range map[string]string{
		"lengths": `step_results = step_results[1:0]`,
		"null":    `step_names = ARRAY[NULL]::text[]`,
	} {
		t.Run(name, func(t *testing.T) {
			pool := pgtest.NewPool(t)
			s := postgres.New(pool)
			lc, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute})
			if err != nil || lc.Lease == nil {
				t.Fatalf("lease: %+v, %v", lc, err)
			}
			if err := lc.Lease.SaveStep(ctx, store.Step{Name: "charge", Result: []byte("ch_1")}); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now(), `+damage); err != nil {
				t.Fatal(err)
			}
			if c, err := s.ClaimLeased(ctx, key, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Minute}); !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("claim of a key with unpaired step arrays: %+v, %v; want store.ErrCorrupt", c, err)
			}
		})
	}
}
