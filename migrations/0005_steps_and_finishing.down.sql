DROP INDEX IF EXISTS idempotency_keys_abandoned_idx;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS takeovers;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS request_metadata;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS request_payload;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS request_method;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS recovery_steps;
