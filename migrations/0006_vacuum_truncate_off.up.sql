-- Autovacuum, when the end of idempotency_keys is empty after the sweeper
-- deleted expired rows, truncates the file under an ACCESS EXCLUSIVE lock.
-- A claim takes the table's ROW EXCLUSIVE lock with NOWAIT, so every claim
-- in that moment gives up with ABORTED (the key looks in use) although no
-- key is. The space is reused by later keys anyway: the table's size
-- follows its peak of live and dead rows, whether or not vacuum gives the
-- tail back. ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock,
-- which claims do not wait for.
ALTER TABLE idempotency_keys SET (vacuum_truncate = false);
