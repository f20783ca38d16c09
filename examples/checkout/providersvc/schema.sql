-- charges is the stub provider's business table: one row per charge made.
-- request_key is deliberately not unique: only idem's key table stands
-- between a retried Charge and a second row, so counting the rows under a
-- key shows whether deduplication worked.
CREATE TABLE IF NOT EXISTS charges (
    id           text        PRIMARY KEY DEFAULT 'ch_' || replace(gen_random_uuid()::text, '-', ''),
    request_key  text        NOT NULL,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    currency     text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS charges_request_key ON charges (request_key);
