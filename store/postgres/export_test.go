package postgres

import "github.com/idemkit/idem/store"

// ScopeID exposes the id a key's row gets, for tests.
func ScopeID(k store.Scope) [16]byte { return scopeOf(k).id.Bytes }
