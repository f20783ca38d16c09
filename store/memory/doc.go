// Package memory is idem's store in the memory of one process: the same
// claims, replays, fingerprints, expiry, leases and fencing tokens as the
// PostgreSQL store, with nothing to set up. It is meant for unit tests of
// services that use idem, and for demos that run as a single process.
//
// # What it does not protect
//
// A claim here shares no transaction with the handler's business data.
// When a handler's writes succeed and the process dies before the outcome is
// recorded, or the handler fails after writing, the writes stay and the key
// does not: a retry runs the handler again. Atomic mode therefore gives no
// more than "at most one request with a key runs at a time, and a recorded
// one is replayed"; it does not make business writes and the key commit
// together, as [github.com/idemkit/idem/store/postgres] does.
//
// Keys live in one process. Two replicas of a server, or a restarted one,
// each have their own keys and will each run a request once. Use the
// PostgreSQL store for anything that runs as more than one process or must
// survive a restart.
//
// # Semantics
//
// The store passes the conformance suite of package
// [github.com/idemkit/idem/store/storetest], as the PostgreSQL store does:
//
//   - A claim of a key whose atomic claim is still running waits, as a
//     PostgreSQL claim waits on the uncommitted row, for at most
//     [WithLockTimeout]: it then returns the recorded entry, takes the key
//     if the owner released it, or fails with store.ErrInUse.
//   - [store.Txn.Context] returns its parent unchanged: there is nothing to
//     join.
//   - Leased claims get a fencing token that is never reused in the Store,
//     and the writes of a lease fail with store.ErrLeaseLost once another
//     request has taken the key over, the key was released and claimed
//     again, forgotten or settled by force, or has expired, and once the
//     lease's own Record or Release took effect.
//   - A step that store.Lease.SaveStep refuses (see store.Lease) is not
//     saved, as the PostgreSQL store refuses it.
//   - The writes of a lease (SaveStep, Extend, Record) fail with
//     the context's error and change nothing when their context has ended;
//     Release works regardless.
//   - It implements store.Admin: [Store.Keys] orders entries by their
//     creation (by [WithClock]), then by tenant, method and key, and an
//     atomic claim still running, like an uncommitted row, is neither
//     listed nor found. Its audit trail is kept in memory for
//     [WithAuditRetention] (90 days): an entry past it is not listed, and
//     is dropped when expired keys are.
//   - It implements store.ReplayCounter: [Store.CountReplay] counts a
//     replay in its entry at once, under the store's lock, so
//     [Store.FlushReplays] has nothing to write.
//
// Outcomes, fingerprints and steps are copied in and out, so
// callers may reuse their buffers.
//
// # Expiry and memory use
//
// Keys expire [WithTTL] after their claim (24 h by default) and then count
// as absent. There is no background goroutine and nothing to close: an
// expired key is replaced when it is next claimed, and each Claim or
// ClaimLeased call that comes at least one TTL after the previous sweep
// deletes every expired key. A Store therefore holds about the keys of the last two TTLs
// of traffic. [WithClock] lets a test move time forward instead of sleeping.
package memory
