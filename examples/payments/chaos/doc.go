// Package chaos proves the payments example's exactly-once promise under
// faults, against real PostgreSQL and real server processes. It holds only
// tests; README.md gives the command.
//
// # What it proves
//
// Every test drives CreatePayment the way a careful client does: one
// idempotency key per logical payment, retried with that key until the
// answer is definitive (OK, or an error the server records and replays).
// Afterwards the database is the judge, not the status codes:
//
//   - exactly one payments row for every key whose answer was OK, and its
//     id is the payment id in every answer the client accepted for the key;
//   - no payments row for a key whose answer was a recorded error;
//   - no payments row that no client asked for, and no key left in
//     progress.
//
// The faults:
//
//   - TestCrashAnywhere kills the payments server with SIGKILL at random
//     moments during concurrent load and restarts it.
//   - TestCrashAfterCommit kills it at the worst moment, after COMMIT and
//     before the response is written (internal/crashserver), and checks
//     that the retry gets the stored response, byte for byte.
//   - TestTerminateBackends cuts the server's PostgreSQL connections with
//     pg_terminate_backend under load; TestPostgresRestart crashes and
//     restarts a PostgreSQL cluster the test owns. In both the server
//     recovers without a restart of its own, no UNAVAILABLE answer carries
//     the database's text (SQLSTATEs, server messages, users, hosts), and
//     the server logged every storage failure a client was told of.
//   - TestFailover runs the server on a primary and a streaming standby
//     through a multi-host connection string (target_session_attrs =
//     read-write), kills the primary's processes with SIGKILL under load
//     and promotes the standby. Synchronous: no acknowledged answer lost,
//     no payment twice, every retry after the failover gets its first
//     answer byte for byte. Asynchronous: it counts the acknowledged
//     answers lost, each lost together with its payment, and checks that
//     each lost key's retry executes exactly once more.
//   - TestDuplicateStorm sends rounds of hundreds of concurrent identical
//     requests under one key: one execution per round, every other answer
//     a replay or ABORTED with RetryInfo, no call stuck behind the
//     connection pool.
//   - TestPgBouncerDuplicateStorm, TestPgBouncerCrashAnywhere and
//     TestPgBouncerCrashAfterCommit run the storm and the crash tests with
//     the server's database URL pointing at a PgBouncer in transaction mode
//     whose pool of two is smaller than the server's and the clients', in
//     pgx's exec mode; the database must see no connection but PgBouncer's.
//   - TestTableLock holds a lock on idempotency_keys (as LOCK TABLE or a
//     migration's ALTER TABLE does) while CreatePayment is called on a
//     server just started and on one that has served: both answer ABORTED
//     after the lock timeout, and serve the key once the lock is gone.
//   - TestHA runs the server against an HA cluster under Patroni, with
//     etcd, behind HAProxy (internal/pgtest's HACluster), and, while 8
//     clients drive payments, kills the leader's machine, runs patronictl
//     switchover and failover, or cuts the leader off by a network
//     partition; also through PgBouncer and with a multi-host URL, and in
//     synchronous and asynchronous mode. It checks what TestFailover
//     checks, that every answer a client was told to retry carried a
//     RetryInfo, and that the sweeper and the finisher beside it came
//     back, and measures the longest time without an answer, the latency
//     and how long until throughput recovered (docs/ha.md). By default it
//     runs a smoke subset; IDEM_HA=full runs every event.
//   - TestCrashAnywhere, TestCrashAfterCommit, their PgBouncer variants,
//     TestTerminateBackends and TestPostgresRestart run once with the
//     server in atomic mode, CreatePayment's own, and once in auto mode
//     (its -mode flag). The clients number their attempts of a key in
//     idem's attempt header, as idem's client interceptor does, so that in
//     auto mode a first attempt claims its key without reading it and a
//     retry reads it first.
//   - TestBadInput is a table of malformed and misused keys, tenants the
//     key table cannot hold (too long, not UTF-8, sent over raw HTTP/2
//     where gRPC clients refuse them), each checked for its answer and for
//     writing nothing, and of stored outcomes gone wrong: records corrupted
//     or relabelled in the table, which are never replayed, and a record
//     that a trigger keeps from taking, after which nothing may have
//     committed.
package chaos
