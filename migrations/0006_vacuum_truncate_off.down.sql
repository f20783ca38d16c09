ALTER TABLE idempotency_keys RESET (vacuum_truncate);
