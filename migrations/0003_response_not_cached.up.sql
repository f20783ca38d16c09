-- response_not_cached marks a completed row whose response was larger than
-- the interceptor's cap: response then holds a small reference from which a
-- loader rebuilds the answer, not the answer itself.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS response_not_cached boolean NOT NULL DEFAULT false;
