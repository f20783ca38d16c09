-- Leased calls keep every step they reached, not only the last one, and,
-- for methods that opt in to completion, what a completer needs to run them
-- again when their callers are gone: the full method name, the request and
-- the metadata its handler reads, dropped when the outcome is recorded.
-- takeovers counts a key's takeovers, which space a completer's attempts.
-- Adding columns with constant defaults does not rewrite the table; the
-- partial index covers only leased calls in progress that can be completed.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS recovery_steps bytea;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS request_method text;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS request_payload bytea;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS request_metadata bytea;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS takeovers integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS idempotency_keys_abandoned_idx ON idempotency_keys (locked_until)
    WHERE status = 'in_progress' AND request_payload IS NOT NULL;
