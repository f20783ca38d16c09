-- Back to the primary key on (tenant, method, key) and a B-tree on
-- expires_at. Like the up migration, one transaction under an ACCESS
-- EXCLUSIVE lock.
DROP INDEX IF EXISTS idempotency_keys_expires_at_brin;
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_pkey;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS id;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (tenant, method, key);
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
