\set k random(1, 1000000000000)
BEGIN;
INSERT INTO payments (tenant_id, customer_id, amount_cents, currency, note, request_key) VALUES ('acme', 'cus_000000000001', 1001, 'EUR', 'order 1', 'k' || :k) RETURNING id::text, created_at;
\startpipeline
INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, response, response_not_cached, expires_at) VALUES (md5('k' || :k)::uuid, 'acme', '/payments.v1.PaymentService/CreatePayment', 'k' || :k, '\x01abababababababababababababababababababababababababababababababab'::bytea, 'recorded', 0, '\xabababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab'::bytea, false, now() + 86400 * interval '1 second');
COMMIT;
\endpipeline
