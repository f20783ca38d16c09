\set k random(1, 1000000000000)
\startpipeline
BEGIN;
SET LOCAL lock_timeout = 2000;
INSERT INTO idempotency_keys (tenant, method, key, request_hash, expires_at) VALUES ('acme', '/payments.v1.PaymentService/CreatePayment', 'k' || :k, '\x01abababababababababababababababababababababababababababababababab'::bytea, now() + 86400 * interval '1 second') ON CONFLICT (tenant, method, key) DO NOTHING RETURNING true;
SELECT status, request_hash, response_code, response, expires_at, expires_at <= now() FROM idempotency_keys WHERE tenant = 'acme' AND method = '/payments.v1.PaymentService/CreatePayment' AND key = 'k' || :k;
SET LOCAL lock_timeout TO DEFAULT;
SAVEPOINT idem_claim;
\endpipeline
INSERT INTO payments (tenant_id, customer_id, amount_cents, currency, note, request_key) VALUES ('acme', 'cus_000000000001', 1001, 'EUR', 'order 1', 'k' || :k) RETURNING id::text, created_at;
\startpipeline
WITH recorded AS (UPDATE idempotency_keys SET status = 'completed', response_code = 0, response = '\xabababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab'::bytea, response_not_cached = false, updated_at = now() WHERE tenant = 'acme' AND method = '/payments.v1.PaymentService/CreatePayment' AND key = 'k' || :k AND status = 'in_progress' RETURNING 1) SELECT CASE WHEN count(*) = 1 THEN 1 ELSE ('idem: recording the outcome updated ' || count(*) || ' rows of idempotency_keys, want 1')::int END FROM recorded;
COMMIT;
\endpipeline
