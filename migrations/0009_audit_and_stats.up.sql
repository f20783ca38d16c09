-- idem_audit is the audit trail of the admin service: one row per
-- operator's action on a key (a forget, a settle, a finish), written in the
-- same transaction as a forget or a settle. key_id is the key's id in
-- idempotency_keys (migration 0004), which outlives the key's row: a
-- forgotten key's history stays listed. expires_at is when the entry is
-- swept, its time plus the store's audit retention; the sweeper deletes
-- expired entries as it deletes expired keys. state_after is NULL when
-- the action deleted the key's row.
--
-- The table is new, so its indexes cost nothing to build. Creating it
-- takes no lock on idempotency_keys.
CREATE TABLE IF NOT EXISTS idem_audit (
    id           uuid        NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    at           timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    key_id       uuid        NOT NULL,
    tenant       text        NOT NULL,
    method       text        NOT NULL,
    key          text        NOT NULL,
    action       text        NOT NULL CHECK (action IN ('forget', 'settle', 'finish')),
    operator     text        NOT NULL,
    reason       text        NOT NULL,
    forced       boolean     NOT NULL,
    state_before text        NOT NULL,
    state_after  text,
    request_id   text        NOT NULL,
    peer         text        NOT NULL
);
CREATE INDEX IF NOT EXISTS idem_audit_at_idx ON idem_audit (at, id);
CREATE INDEX IF NOT EXISTS idem_audit_tenant_at_idx ON idem_audit (tenant, at, id);
CREATE INDEX IF NOT EXISTS idem_audit_key_idx ON idem_audit (key_id, at, id);
CREATE INDEX IF NOT EXISTS idem_audit_expires_at_idx ON idem_audit (expires_at);

-- Two indexes on idempotency_keys for the admin service: the order of
-- ListKeys's pages, (created_at, id), which it sorted the filtered table
-- by before, and the same order over the rows in progress only, the
-- stuck keys that GetKeyStats counts and whose oldest it reads. A claim writes
-- one more index entry (two while its row is in progress); a record of a
-- leased call was not a HOT update before either (the partial index of
-- migration 0005 names status).
--
-- Migrate runs each migration in a transaction, where CREATE INDEX
-- CONCURRENTLY cannot run, so these builds take a SHARE lock on
-- idempotency_keys: claims wait for them (each for at most its lock
-- timeout, then the client retries) for as long as the builds take,
-- each a read of the whole table and a sort. On a large table, build them
-- first, outside a transaction, with the same names, and this migration
-- finds them (IF NOT EXISTS) and waits for nothing:
--
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_created_at_idx
--       ON idempotency_keys (created_at, id);
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_in_progress_idx
--       ON idempotency_keys (created_at, id) WHERE status = 'in_progress';
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at_idx ON idempotency_keys (created_at, id);
CREATE INDEX IF NOT EXISTS idempotency_keys_in_progress_idx ON idempotency_keys (created_at, id) WHERE status = 'in_progress';
