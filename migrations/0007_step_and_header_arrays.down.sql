ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS request_header_values;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS request_header_names;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS step_results;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS step_names;
