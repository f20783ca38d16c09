package postgres

import "github.com/idemkit/idem/store"

// ScopeID exposes the id a key's row gets, for tests.
func ScopeID(k store.Scope) [16]byte { return scopeOf(k).id.Bytes }

// PendingReplays returns how many keys' replay counts s keeps in memory,
// for tests.
func PendingReplays(s *Store) int {
	s.replays.mu.Lock()
	defer s.replays.mu.Unlock()
	return len(s.replays.pending)
}
