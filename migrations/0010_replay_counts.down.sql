-- The counts of replays go: the version before 0010 neither reads nor
-- writes them.
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS last_replayed_at;
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS replays;
