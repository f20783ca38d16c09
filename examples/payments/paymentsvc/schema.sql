-- payments is the example's business table. The claim of an idempotency key
-- and the insert below share one transaction, so a payment exists exactly
-- when its key is recorded as completed. request_key is a backstop: even a
-- caller that bypassed idem could not store two payments for one key.
CREATE TABLE IF NOT EXISTS payments (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id    text        NOT NULL,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    currency     text        NOT NULL,
    note         text        NOT NULL DEFAULT '',
    request_key  text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, request_key)
);
