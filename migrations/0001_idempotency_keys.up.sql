-- idempotency_keys holds one row per (tenant, method, key). The primary key is
-- what makes a claim atomic: of concurrent inserts of one key, one wins and
-- the others wait for it, then see its row.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant        text        NOT NULL,
    method        text        NOT NULL,
    key           text        NOT NULL,
    -- request_hash is the request's fingerprint (a version byte and a
    -- SHA-256); raw request payloads are never stored.
    request_hash  bytea       NOT NULL,
    status        text        NOT NULL DEFAULT 'in_progress'
                  CHECK (status IN ('in_progress', 'completed')),
    -- response_code is the gRPC status code; response holds the serialized
    -- response message (code 0) or google.rpc.Status (any other code).
    response_code integer,
    response      bytea,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    -- expires_at: past it the row counts as absent and may be deleted.
    expires_at    timestamptz NOT NULL,
    -- Reserved for leased mode: a lease that a retry may take over once it
    -- has run out, a fencing token that guards the record, and the last
    -- recovery point a handler reached. Unused in atomic mode.
    locked_until  timestamptz,
    fencing_token bigint,
    recovery_point text,
    recovery_data  bytea,
    PRIMARY KEY (tenant, method, key),
    CHECK (status <> 'completed' OR response_code IS NOT NULL)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
