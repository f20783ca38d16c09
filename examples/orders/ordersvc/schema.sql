-- orders is the orders example's business table. The order is inserted on
-- the transaction that holds PlaceOrder's idempotency key, so an order
-- exists exactly when its key is recorded as completed.
CREATE TABLE IF NOT EXISTS orders (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id      text        NOT NULL,
    customer_id    text        NOT NULL,
    sku            text        NOT NULL,
    quantity       integer     NOT NULL CHECK (quantity > 0),
    reservation_id text        NOT NULL DEFAULT '',
    payment_ids    text[]      NOT NULL DEFAULT '{}',
    request_key    text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, request_key)
);
