-- The checkout example's business tables. Checkout runs in leased mode, so
-- it gets no transaction from idem: each step makes its own writes, and
-- makes them idempotent under the request's key, because a retry that
-- takes the key over may repeat the step the crashed attempt was in. The
-- example has one tenant; a multi-tenant service keys these rows by
-- (tenant, request_key), as idem scopes keys.

-- stock is what can be sold.
CREATE TABLE IF NOT EXISTS stock (
    sku       text    PRIMARY KEY,
    available integer NOT NULL CHECK (available >= 0)
);

-- reservations holds stock for one checkout. The unique request_key makes
-- reserving twice under one key a no-op.
CREATE TABLE IF NOT EXISTS reservations (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    request_key text        NOT NULL UNIQUE,
    sku         text        NOT NULL,
    quantity    integer     NOT NULL CHECK (quantity > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- orders are confirmed checkouts: paid with charge_id at the provider.
CREATE TABLE IF NOT EXISTS orders (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    request_key    text        NOT NULL UNIQUE,
    reservation_id uuid        NOT NULL UNIQUE REFERENCES reservations,
    charge_id      text        NOT NULL,
    amount_cents   bigint      NOT NULL,
    currency       text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
