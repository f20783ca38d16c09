\set k random(1, 1000000000000)
\set c random(0, 99999)
\set amount random(1000, 1999)
BEGIN;
INSERT INTO payments (tenant_id, customer_id, amount_cents, currency, note, request_key) VALUES ('acme', 'cus_' || lpad(:c::text, 12, '0'), :amount, 'EUR', 'order 1', 'k' || :k) RETURNING id::text AS payment_id, created_at \gset
UPDATE accounts SET balance_cents = balance_cents + :amount, updated_at = now() WHERE tenant_id = 'acme' AND customer_id = 'cus_' || lpad(:c::text, 12, '0') RETURNING balance_cents \gset
INSERT INTO ledger_entries (tenant_id, customer_id, payment_id, amount_cents, balance_cents) VALUES ('acme', 'cus_' || lpad(:c::text, 12, '0'), :payment_id, :amount, :balance_cents);
\startpipeline
SELECT set_config('idem.lock_timeout', current_setting('lock_timeout'), true), set_config('lock_timeout', '5000', true);
WITH recorded AS (INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, response, response_not_cached, expires_at) VALUES (md5('k' || :k)::uuid, 'acme', '/payments.v1.PaymentService/CreatePayment', 'k' || :k, '\x01abababababababababababababababababababababababababababababababab'::bytea, 'recorded', 0, '\xabababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab'::bytea, false, now() + 86400 * interval '1 second') RETURNING 1) SELECT CASE WHEN count(*) = 1 THEN 1 ELSE ('idem: recording the outcome wrote ' || count(*) || ' rows of idempotency_keys, want 1')::int END FROM recorded;
COMMIT;
\endpipeline
