-- Each key counts the calls answered from its recorded outcome (replays)
-- and when the last was (last_replayed_at), so that an operator can tell
-- whether a call was retried. Servers count replays in memory and add them
-- in batches (see the postgres store's WithReplayCounts): a replay itself
-- writes nothing, and a server that crashes loses the counts it had not
-- written yet. Adding columns with a constant default or none does not
-- rewrite the table; neither column is indexed, so the batches' updates
-- can be HOT.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS replays bigint NOT NULL DEFAULT 0;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS last_replayed_at timestamptz;
