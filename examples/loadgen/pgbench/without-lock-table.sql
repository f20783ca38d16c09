\set k random(1, 1000000000000)
\set lock :k % 2147483647
\startpipeline
BEGIN;
SELECT pg_try_advisory_xact_lock(1768187245, :lock), now();
SELECT status, request_hash, response_code, response, response_not_cached, expires_at, expires_at <= now(), CASE WHEN status = 'in_progress' AND locked_until > now() THEN extract(epoch FROM locked_until - now()) ELSE 0 END FROM idempotency_keys WHERE id = md5('k' || :k)::uuid AND tenant = 'acme' AND method = '/payments.v1.PaymentService/CreatePayment' AND key = 'k' || :k;
\endpipeline
INSERT INTO payments (tenant_id, customer_id, amount_cents, currency, note, request_key) VALUES ('acme', 'cus_000000000001', 1001, 'EUR', 'order 1', 'k' || :k) RETURNING id::text, created_at;
\startpipeline
SELECT set_config('idem.lock_timeout', current_setting('lock_timeout'), true), set_config('lock_timeout', '5000', true);
WITH recorded AS (INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, response, response_not_cached, expires_at) VALUES (md5('k' || :k)::uuid, 'acme', '/payments.v1.PaymentService/CreatePayment', 'k' || :k, '\x01abababababababababababababababababababababababababababababababab'::bytea, 'recorded', 0, '\xabababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab'::bytea, false, now() + 86400 * interval '1 second') RETURNING 1) SELECT CASE WHEN count(*) = 1 THEN 1 ELSE ('idem: recording the outcome wrote ' || count(*) || ' rows of idempotency_keys, want 1')::int END FROM recorded;
COMMIT;
\endpipeline
