-- Back to the status 'completed' and the columns of migration 0007's
-- schema, which a server of the version before 0008 reads and writes.
-- The columns come back empty: the steps and the kept metadata are in the
-- arrays, where that version reads them first. Like the up migration, one
-- transaction under an ACCESS EXCLUSIVE lock, which writes every recorded
-- row once.
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_status_check;
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_check;
ALTER TABLE idempotency_keys
    ADD COLUMN IF NOT EXISTS recovery_point text,
    ADD COLUMN IF NOT EXISTS recovery_data bytea,
    ADD COLUMN IF NOT EXISTS recovery_steps bytea,
    ADD COLUMN IF NOT EXISTS request_metadata bytea;
UPDATE idempotency_keys SET status = 'completed' WHERE status = 'recorded';
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_status_check CHECK (status IN ('in_progress', 'completed'));
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_check CHECK (status <> 'completed' OR response_code IS NOT NULL);
