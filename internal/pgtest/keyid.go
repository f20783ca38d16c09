package pgtest

// KeyIDSQL returns the SQL expression of the id that idem's PostgreSQL
// store gives the row of a key in idempotency_keys, the table's primary
// key, from SQL expressions of the key's tenant, method and key: for tests
// that write rows of the table themselves, such as
//
//	INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, expires_at)
//	SELECT <KeyIDSQL("t", "m", "k")>, t, m, k, '\x01', now()
//	FROM (VALUES ('acme', '/pkg.Svc/M', 'key-1')) v(t, m, k)
//
// It is the expression of migration 0004: the first 16 bytes of the
// SHA-256 of the three, each preceded by its length in bytes as a
// big-endian 64-bit integer, as a uuid.
func KeyIDSQL(tenant, method, key string) string {
	part := func(e string) string {
		return "int8send(octet_length(" + e + ")) || convert_to(" + e + ", 'UTF8')"
	}
	return "encode(substring(sha256(" + part(tenant) + " || " + part(method) + " || " + part(key) + ") FROM 1 FOR 16), 'hex')::uuid"
}
