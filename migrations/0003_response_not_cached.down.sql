ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS response_not_cached;
