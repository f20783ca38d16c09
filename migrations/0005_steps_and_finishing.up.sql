-- Leased calls keep every step they reached, not only the last one, and,
-- for methods that opt in to being finished, what a finisher needs to run
-- them again when their callers are gone: the full method name, the
-- request and the metadata its handler reads, dropped when the outcome is
-- recorded. takeovers counts a key's takeovers, which space a finisher's
-- attempts. Adding columns with constant defaults does not rewrite the
-- table; the partial index covers only leased calls in progress that can
-- be finished.
--
-- (The file was named 0005_steps_and_completion; Migrate and other tools
-- track a migration by its number, so the new name runs nothing again.)
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS recovery_steps bytea;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS request_method text;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS request_payload bytea;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS request_metadata bytea;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS takeovers integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS idempotency_keys_abandoned_idx ON idempotency_keys (locked_until)
    WHERE status = 'in_progress' AND request_payload IS NOT NULL;
