-- shipments is the consumer's side effect: one row per order to ship. It
-- has no unique constraint on purpose, so that only the inbox
-- (processed_messages) stands between a redelivered message and a second
-- shipment.
CREATE TABLE IF NOT EXISTS shipments (
    id         bigserial   PRIMARY KEY,
    event_id   text        NOT NULL,
    order_id   text        NOT NULL,
    sku        text        NOT NULL,
    quantity   integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
