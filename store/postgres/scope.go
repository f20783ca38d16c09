package postgres

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem/store"
)

// lockClass is the first key of the transaction-scoped advisory locks idem
// takes, pg_advisory_xact_lock(lockClass, n): "idem" in ASCII. The locks
// of the two-key form never conflict with those of the one-key form, so
// an application's pg_advisory_lock(bigint) never meets idem's; one that
// uses the two-key form with this first key would only make some claims
// wait.
const lockClass int32 = 0x6964656d

// scope is a key's row identity: id, the primary key of idempotency_keys,
// and lock, the second key of the advisory lock that serializes claims of
// the key.
type scope struct {
	id   pgtype.UUID // a pgx type, so that every QueryExecMode can send it
	lock int32
}

// scopeOf hashes k: SHA-256 of its tenant, method and key, each preceded by
// its length in bytes as a big-endian uint64 (so that no two keys hash the
// same input), of which the id takes bytes 0 to 15 and the lock 16 to 19.
// Migration 0004 computes the same id in SQL for rows that existed before
// it.
func scopeOf(k store.Scope) scope {
	var buf [320]byte // enough for most keys without an allocation
	b := buf[:0]
	for _, s := range [...]string{k.Tenant, k.Method, k.Key} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	sum := sha256.Sum256(b)
	var sc scope
	copy(sc.id.Bytes[:], sum[:16])
	sc.id.Valid = true
	sc.lock = int32(binary.BigEndian.Uint32(sum[16:20]))
	return sc
}
