-- The ledger handler's tables (loadgen -handler ledger, and the ledger-*.sql
-- pgbench scripts), created next to paymentsvc's payments table: a balance
-- per customer, and one ledger entry per payment. Tenant acme's 100 000
-- customers, cus_000000000000 to cus_000000099999, each have an account, so
-- that concurrent payments rarely update the same row.
CREATE TABLE IF NOT EXISTS accounts (
    tenant_id     text        NOT NULL,
    customer_id   text        NOT NULL,
    balance_cents bigint      NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, customer_id)
);

CREATE TABLE IF NOT EXISTS ledger_entries (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id     text        NOT NULL,
    customer_id   text        NOT NULL,
    payment_id    uuid        NOT NULL REFERENCES payments (id),
    amount_cents  bigint      NOT NULL,
    balance_cents bigint      NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

INSERT INTO accounts (tenant_id, customer_id)
SELECT 'acme', 'cus_' || lpad(n::text, 12, '0') FROM generate_series(0, 99999) AS n
ON CONFLICT DO NOTHING;

ANALYZE accounts;
