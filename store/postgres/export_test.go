package postgres

import "github.com/idemkit/idem/store"

// ScopeID exposes the id a key's row gets, for tests.
func ScopeID(k store.Scope) [16]byte { return scopeOf(k).id.Bytes }

// The admin service's queries, for the tests that EXPLAIN them.
const (
	AdminKeysSQL   = adminKeys
	StatsCountsSQL = statsCounts + statsGroup
	StatsStuckSQL  = statsCounts + statsInProgress + statsGroup
	StatsOldestSQL = statsOldest
)

// PendingReplays returns how many keys' replay counts s keeps in memory,
// for tests.
func PendingReplays(s *Store) int {
	s.replays.mu.Lock()
	defer s.replays.mu.Unlock()
	return len(s.replays.pending)
}

// ReplayFlushState reports whether a flush that s started on its own
// runs, and whether its timer is armed, for tests.
func ReplayFlushState(s *Store) (running, armed bool) {
	s.replays.mu.Lock()
	defer s.replays.mu.Unlock()
	return s.replays.running, s.replays.armed
}
