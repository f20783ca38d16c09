package main

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
)

// TestFloorCountsExactly sends a few requests of the scenarios whose
// counts are exact, with each handler, and counts them with the loadgen's
// own counters: sql-floor must send the round trips and commits of
// sql-atomic, or it is no floor; and every first execution costs the
// handler's round trips plus BEGIN and COMMIT, whatever the handler.
func TestFloorCountsExactly(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and takes seconds: runs without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatalf("PostgreSQL (set DATABASE_URL or the libpq defaults, or install PostgreSQL's binaries for a throwaway cluster): %v", err)
	}
	defer pg.Close()

	const n = 5
	for _, h := range handlers {
		t.Run(h.name, func(t *testing.T) {
			got := map[string]counts{}
			for _, name := range []string{"baseline", "atomic", "optimistic", "auto", "leased", "naive", "sql-baseline", "sql-atomic", "sql-optimistic", "sql-floor"} {
				got[name] = countRequests(ctx, t, h, pg, name, n)
			}
			per := func(c int64) float64 { return float64(c) / n }
			floor, atomic := got["sql-floor"], got["sql-atomic"]
			if floor.RoundTrips != atomic.RoundTrips || floor.Commits != atomic.Commits {
				t.Errorf("sql-floor: %v round trips and %v commits per request, sql-atomic %v and %v: the floor must send what atomic sends",
					per(floor.RoundTrips), per(floor.Commits), per(atomic.RoundTrips), per(atomic.Commits))
			}
			if a, o := got["auto"], got["optimistic"]; a != o {
				t.Errorf("auto, first attempts: %+v; optimistic %+v: want the same", a, o)
			}
			// BEGIN, the handler's statements, COMMIT (pipelined with the
			// key row where there is one).
			trips := int64(h.statements + 2)
			for name, want := range map[string]counts{
				"baseline":     {RoundTrips: trips, Commits: 1},
				"atomic":       {RoundTrips: trips, Commits: 1},
				"sql-baseline": {RoundTrips: trips, Commits: 1, Statements: trips},
				"sql-atomic":   {RoundTrips: trips, Commits: 1},
				"optimistic":   {RoundTrips: trips, Commits: 1},
				"auto":         {RoundTrips: trips, Commits: 1},
				// BEGIN, the statements, the lock timeout, the key row,
				// COMMIT: one statement more than the floor.
				"sql-optimistic": {RoundTrips: trips, Commits: 1, Statements: trips + 2},
				// BEGIN, the statements, the key row, COMMIT.
				"sql-floor": {RoundTrips: trips, Commits: 1, Statements: trips + 1},
				// The claim and the record commit on their own.
				"leased": {RoundTrips: trips + 2, Commits: 3},
				// SET LOCAL, the claim and the record, a round trip each.
				"naive": {RoundTrips: trips + 3, Commits: 1, Statements: trips + 3},
			} {
				c := got[name]
				if c.RoundTrips != n*want.RoundTrips || c.Commits != n*want.Commits || c.Rollbacks != 0 ||
					(want.Statements != 0 && c.Statements != n*want.Statements) {
					t.Errorf("%s: %d requests sent %+v, want %d round trips, %d commits, no rollback each (and %d statements, where given)",
						name, n, c, want.RoundTrips, want.Commits, want.Statements)
				}
			}
		})
	}
}

// countRequests runs scenario name with handler h on a pool of one
// connection, warms it with two requests (a connection's first two claims
// cost more: idem prepares its statements on them, see store/postgres's
// overview), and returns what n more requests sent.
func countRequests(ctx context.Context, t *testing.T, h *handler, pg *pgtest.Server, name string, n int) counts {
	t.Helper()
	s, err := lookupScenario(name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := defaultConfig()
	cfg.Clients, cfg.PoolSize = 1, 1
	e, closeEnv, err := openEnv(ctx, cfg, h, pg, "", nil, s)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer closeEnv()
	const warm = 2
	for i := range n + warm {
		if i == warm {
			quiesce(e.pool)
			e.counters.reset()
		}
		if o, err := s.call(ctx, e); err != nil || o != executed {
			t.Fatalf("%s: request %d: %v, %v; want executed", name, i, o, err)
		}
	}
	quiesce(e.pool)
	return e.counters.snapshot()
}
