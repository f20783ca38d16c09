-- The key table's primary key becomes id, the first 16 bytes of the SHA-256
-- of the scope (tenant, method, key; each preceded by its length in bytes as
-- a big-endian 64-bit integer), stored as a uuid: a narrow index that any
-- length of tenant, method or key fits. tenant, method and key stay as plain
-- columns, for operators, and every read compares them, so a collision of
-- ids could only make two keys wait for each other, never share an entry.
-- The expires_at B-tree gives way to a BRIN index: expiry follows insertion
-- order, and the sweeper is its only reader.
--
-- It runs in one transaction that holds an ACCESS EXCLUSIVE lock on
-- idempotency_keys from its first statement to its commit: claims wait for
-- it (each for at most its lock timeout, then the client retries). It
-- rewrites the table once (the UPDATE) and builds the new indexes; see
-- docs/upgrading.md for how long that takes. Servers of an earlier version
-- cannot claim keys once it has run (their ON CONFLICT names the old primary
-- key, and fails), so replace them promptly; their leased calls in flight
-- still record their outcomes.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS id uuid;
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_pkey;
DROP INDEX IF EXISTS idempotency_keys_expires_at_idx;
UPDATE idempotency_keys SET id = encode(substring(sha256(
        int8send(octet_length(tenant)) || convert_to(tenant, 'UTF8') ||
        int8send(octet_length(method)) || convert_to(method, 'UTF8') ||
        int8send(octet_length(key)) || convert_to(key, 'UTF8')
    ) FROM 1 FOR 16), 'hex')::uuid
WHERE id IS NULL;
ALTER TABLE idempotency_keys ALTER COLUMN id SET NOT NULL;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (id);
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_brin ON idempotency_keys USING brin (expires_at);
