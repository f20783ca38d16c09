// Package postgres is idem's store on PostgreSQL (pgx v5): each keyed
// request runs in one transaction that claims the key, holds the handler's
// writes and records the response, so they commit together or not at all.
//
// # Setup
//
// Apply the schema with [Migrate] (or run the SQL files of package
// github.com/idemkit/idem/migrations with your own tool), then hand
// [New] to idem's engine, which the interceptor takes:
//
//	if err := postgres.Migrate(ctx, pool); err != nil { ... }
//	engine, err := idem.New(postgres.New(pool), idem.WithTenant(tenantOf))
//	if err != nil { ... }
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))
//
// # The transaction
//
// Each key has one row in idempotency_keys, written once, when its outcome
// is recorded; the primary key is a 16-byte hash of the key's scope (tenant,
// method, key), which stay in the row as plain columns.
//
// A claim sends BEGIN, a lock of the table for writing (NOWAIT), a try of
// a transaction-scoped advisory lock on the key's scope and a SELECT of the
// key's row as one pipelined batch: one round trip. The advisory lock
// serializes the claims of one key; a key already recorded needs none, so
// its replays run side by side. The handler gets the open transaction from
// [TxFromContext] as a pgx.Tx (the one pgx began, with Commit and Rollback
// refused). When it returns, the lock timeout, one INSERT of the key's row
// with its outcome, which raises when it writes nothing, and COMMIT travel
// together in one more round trip. A recorded error rolls the transaction back, so the
// handler's writes are discarded, and records the error in a transaction of
// its own under the key's lock taken again. A crash or a lost connection before
// COMMIT leaves nothing behind. A claim that finds the key recorded
// answers after its one round trip and rolls back in the background.
//
// A second request with the same key waits on the first one's advisory lock
// for at most the lock timeout ([WithLockTimeout]); then it reads the row
// the first committed (and replays it) or gives up with store.ErrInUse. The
// session's lock_timeout is restored before the handler runs, and the lock
// timeout set again for the record, so the bound applies to idem's
// statements, not to the handler's.
//
// The advisory lock is an optimization; the primary key is the guarantee.
// Where a claim gets past the lock without seeing the row its holder
// committed (under REPEATABLE READ or SERIALIZABLE, whose snapshot predates
// the wait, or on an engine whose locks are weaker), its record fails on
// the primary key, its writes roll back, and it reports store.ErrConflict,
// which the engine answers with ABORTED; the retry replays. Two keys
// whose hashes collide could only wait for each other, never share a row:
// every read compares the whole scope.
//
// The lock timeout bounds every wait of a claim, atomic or leased, the
// wait for a table lock too (a LOCK TABLE, a migration's ALTER TABLE, a
// CREATE INDEX), and on every connection. It bounds the record's waits,
// and those of a lease's writes, as well: behind a key's row that a session
// outside idem's lock holds (an INSERT of it not yet committed, a SELECT …
// FOR UPDATE), a record gives up with store.ErrInUse, committing nothing,
// rather than wait for that session to end. Parsing a statement locks the
// tables it names, so none of idem's is parsed outside its transaction
// without a bound: in pgx's exec and simple_protocol modes the server
// parses each statement of a batch after its BEGIN and lock timeout ran;
// in cache_statement, pgx's default, idem prepares its statements by name
// the first time a connection uses them, inside a transaction begun first
// under the lock timeout, and runs them from then on without preparing
// them again; in cache_describe and describe_exec, which keep no statement
// on the server, the claim always begins the transaction and sets the lock
// timeout in a round trip of its own, and pgx describes the statements
// inside it. So a claim costs one round trip in exec, simple_protocol and
// cache_statement (the first on a connection four, the second two), two in
// cache_describe (three the first time) and three in describe_exec.
//
// # Optimistic claims
//
// A claim with store.ClaimRequest.Optimistic set sends BEGIN alone (one round
// trip, as the handler's own transaction would) and reads nothing. Its
// record is an atomic claim's (the lock timeout, the INSERT of the
// key's row with its outcome, COMMIT, in one round trip), the first statements on
// idempotency_keys in the transaction, so the lock timeout bounds their
// waits, behind a table lock or a row of the key that another transaction
// has not committed (a duplicate's record, which it waits for). A row of
// the key, live or expired, fails the INSERT on the primary key:
// store.ErrConflict, and the handler's writes roll back with it. The
// caller's atomic claim that follows answers from a live row or takes an
// expired one over; taking it over in the record instead (ON CONFLICT … DO
// UPDATE) would cost every record the speculative insertion. In cache_statement a connection's first record of this kind sets the
// lock timeout and prepares the INSERT under it before sending, as a
// claim does; cache_describe and describe_exec describe it after the lock
// timeout is set.
//
// # Leased mode
//
// [Store.ClaimLeased] claims a key for a handler that runs outside the claim's
// transaction: one round trip takes the key's advisory lock, inserts the
// row (or takes over one whose lease ran out under the same request, or
// that expired) with locked_until and a random fencing token, and commits.
// Extending the lease, saving a step, recording the outcome and
// releasing are then one statement each, in a transaction of its own under
// the lock timeout (BEGIN, the lock timeout, the statement and COMMIT: one
// round trip, more in some QueryExecModes, as for a claim), every
// one matching the row only while its token is current. A step that
// store.Step.Validate refuses is refused before any round trip.
//
// # Poolers and distributed engines
//
// The hot path keeps no session state outside its transaction, so it works
// through a transaction-mode pooler such as PgBouncer; configure the pool's
// QueryExecMode for what the pooler supports (pgx prepares statements by
// default). PgBouncer before 1.21 keeps no prepared statement across
// transactions: use pgx.QueryExecModeExec (default_query_exec_mode=exec in
// the connection string), never QueryExecModeDescribeExec, whose two round
// trips may land on two server connections. The lock timeout does not
// bound a wait in the pooler's queue for a server connection; set
// PgBouncer's query_wait_timeout. docs/pgbouncer.md in the repository has
// the settings and the pool size.
//
// The store uses only INSERT ... ON CONFLICT, RETURNING, set_config(...,
// true), transaction-scoped advisory locks, LOCK TABLE and plain UPDATEs:
// no server-side functions of its own. Always point the store at the
// primary.
//
// # Tenant shards
//
// Tenants whose data lives in different databases share one store from
// [NewSharded]: a route maps each tenant to its shard, and everything done
// for a key (the claim, the handler's writes through [TxFromContext], the
// record, every later write of a lease) runs on that shard, so the claim
// and the handler's writes stay one transaction on one database. A route
// that gives no shard fails the call with [ErrNoShard].
// [Store.Abandoned], [Store.Check] and a [Store.Keys] of every tenant look
// at every shard. [Migrate] each shard, run a [Sweeper] on each, and
// record a message with an inbox (package inbox) on the shard whose data
// it changes. docs/shards.md in the repository
// says how to move a tenant between shards, and what Citus, CockroachDB or
// YugabyteDB would need.
//
// # Operators
//
// The store implements [store.Admin]: [Store.Keys] lists keys a page at a
// time, ordered by created_at (the database's clock) and id, with a
// cursor of the last row's; [Store.Key] reads one; [Store.Forget] deletes
// one and [Store.Settle] records an outcome for one in progress. Each
// write is one statement in a transaction of its own under the lock
// timeout, which decides on the row as it finds it once it holds it, so
// that a lease taken a moment before is not overridden unless forced. A
// forced write fences the lease's holder, whose later writes match no row
// and fail with store.ErrLeaseLost. States are told by the store's clock
// ([WithClock]). On a sharded store a listing of one tenant asks its shard;
// one of every tenant asks every shard and merges their pages. The index
// idempotency_keys_created_at_idx (migration 0009) serves the listing's
// order: a page walks it from its cursor and reads the rows until it has
// its limit of those its filter selects.
//
// Forget and Settle keep their [store.AuditEntry], when given one, in the
// table idem_audit, in the transaction of the change: they lock the key's
// row first, then one statement changes it and inserts the entry only if
// it did, with the state the row had. [Store.AddAudit] inserts an entry
// on its own (a finish's) and [Store.AuditLog] lists them, on the key's
// tenant's shard. Entries are kept for [WithAuditRetention] (90 days)
// and deleted by the [Sweeper] after that. [Store.Stats] counts the keys a
// filter selects: a filter of the states in progress and abandoned reads
// only the rows in progress, through the partial index
// idempotency_keys_in_progress_idx, and so does the search for the oldest
// of them; counts of recorded keys read every row the filter selects (on
// a table of 100 000 keys, about 40 ms here), so bound them by creation
// time on large tables.
//
// # Replays
//
// The store counts, per key, the calls answered from its recorded outcome
// ([Store.CountReplay], which idem's engine calls; [store.KeyInfo] shows
// Replays and LastReplay). A replay writes nothing: it adds to a count in
// memory, and the store writes the counts in batches, one UPDATE of up to
// 10 000 keys every second, or sooner once 10 000 keys' counts wait
// ([WithReplayFlush]), in a goroutine of its own that runs only while
// counts wait. Each key's row is written once per batch however often it
// was replayed, and a row that another session holds locked is skipped and
// counted at the next batch. Call [Store.FlushReplays] at shutdown, after
// the server stopped and before the pool closes; a server that crashes
// loses the counts of its last second, which is acceptable for a record
// that decides nothing. idem.WithReplayCounts(false) turns counting off.
// The counts live in the columns replays and last_replayed_at (migration
// 0010).
//
// # Expiry
//
// Keys expire after [WithTTL] (24 h by default). An expired key counts as
// absent: the next request with it takes the row over and runs again.
//
// Expired rows stay in the tables until a [Sweeper] deletes them, from
// idempotency_keys, processed_messages and idem_audit alike. [Sweeper.Run] sweeps every
// minute, in batches of 1000 rows with a pause between them; each batch
// locks only expired rows and skips those others hold, so claims of live
// keys never wait for it and every replica may run one.
//
// # Message consumers
//
// The same guarantee for at-least-once brokers is package
// [github.com/idemkit/idem/store/postgres/inbox]: it records each processed
// message's producer-assigned id in processed_messages, which [Migrate]
// creates and a [Sweeper] sweeps, in the transaction that applies the
// message.
//
// # Metrics, traces and logs
//
// The sweeper reports through the OpenTelemetry API, by default to the
// global providers: it counts the rows it deletes (idem.sweeper.deleted,
// by idem.table), times its passes (idem.sweeper.pass.duration, and a span
// idem.sweeper.pass), and logs a failed pass through log/slog
// ([WithLogger]). [WithMeterProvider] and [WithTracerProvider] configure
// it. The store itself does not log.
package postgres
