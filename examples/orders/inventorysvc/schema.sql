-- reservations is the inventory stub's business table; request_key is the
-- idempotency key the reservation was made under.
CREATE TABLE IF NOT EXISTS reservations (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    sku         text        NOT NULL,
    quantity    integer     NOT NULL CHECK (quantity > 0),
    request_key text        NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
