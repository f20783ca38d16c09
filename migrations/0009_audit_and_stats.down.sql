-- The audit trail goes, with its entries, and so do the admin service's
-- indexes on idempotency_keys.
DROP INDEX IF EXISTS idempotency_keys_in_progress_idx;
DROP INDEX IF EXISTS idempotency_keys_created_at_idx;
DROP TABLE IF EXISTS idem_audit;
