\set k random(1, 1000000000000)
BEGIN;
INSERT INTO payments (tenant_id, customer_id, amount_cents, currency, note, request_key) VALUES ('acme', 'cus_000000000001', 1001, 'EUR', 'order 1', 'k' || :k) RETURNING id::text, created_at;
COMMIT;
