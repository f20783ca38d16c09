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
