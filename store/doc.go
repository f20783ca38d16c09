// Package store is the contract between idem's engine and the storage that
// holds its claims: the interfaces a store implements, what they exchange
// and the errors they report. A store is implemented from this package's
// documentation alone, and proves it with the conformance suite of package
// github.com/idemkit/idem/store/storetest.
//
// # Scopes and entries
//
// A claim is made for a [Scope]: the client's idempotency key, within a
// tenant and a method. A store holds every scope that [Scope.Validate]
// accepts (bounded lengths, valid UTF-8, no NUL byte) and refuses every
// other, in each method that takes one, with an error wrapping
// [ErrInvalidScope] before it touches its storage, so that a scope works on
// every store or on none.
//
// A store keeps at most one entry per scope. An entry is in progress while
// its request runs, recorded once its [Outcome] is, and expired once its
// TTL has passed, from when it was first claimed: an expired entry counts
// as absent, and the next claim of its scope takes it over as if the scope
// were free ([State]). An entry keeps the fingerprint of the request that
// claimed it. A later claim is answered with the entry (an [Entry]), never
// given the scope, unless the entry has expired or, for a leased claim with
// the same fingerprint, its lease has run out; the engine compares the
// fingerprint of an Entry with its request's, to replay or refuse.
//
// # Atomic claims
//
// [Store.Claim] is the only way to learn whether a scope is free, and it
// must decide atomically: of any number of concurrent claims of one scope,
// exactly one gets a [Txn]; the others get the scope's Entry once the
// owner has recorded, or the scope once it has released, or [ErrInUse]
// when a bounded wait runs out. "Check, then insert" is not an
// implementation of Claim. The owner runs the handler in the context of
// [Txn.Context], so that the handler's writes join the claim, and ends the
// Txn with [Txn.Record], which records the outcome together with those
// writes (or, for an error, without them), or with [Txn.Release], which
// leaves no trace so that a retry runs afresh.
//
// # Leased claims
//
// [Store.ClaimLeased] is the claim of leased mode, for handlers whose side
// effects leave the storage: the claim is durable at once and held for a
// lease, guarded by a fencing token that changes with every holder. While
// the lease runs, other claims see an in-progress Entry with its remaining
// time; once it has run out, a claim with the same fingerprint takes the
// scope over, keeping the steps saved under it ([Step]), and every later
// write of the earlier holder's [Lease] fails with [ErrLeaseLost] and
// changes nothing. The holder saves each step as it runs it
// ([Lease.SaveStep]), extends the lease while it works ([Lease.Extend]) and
// ends it with [Lease.Record] or [Lease.Release].
//
// # Optional parts
//
// A store may implement three more interfaces, which callers discover by
// a type assertion on the Store: [Finishing], for stores that keep what a
// finisher needs to finish a leased call whose caller is gone
// ([LeaseRequest].Call), [Admin], for stores that let an operator list,
// read, forget and settle entries, and [ReplayCounter], for stores that
// count each entry's replays, without a write on the replay's path, for
// Admin to show. The conformance suite runs the cases of each exactly when
// the store implements it (ReplayCounter's with Admin).
//
// # Errors
//
// A store reports its refusals with this package's sentinels, wrapped so
// that errors.Is finds them: [ErrInUse], [ErrConflict], [ErrLeaseLost],
// [ErrNotReady], [ErrInvalidScope], [ErrInvalidStep] and [ErrCorrupt],
// and for Admin [ErrNotFound], [ErrNotInProgress], [ErrInvalidCursor],
// [ErrInvalidStatus] and [*LeaseLiveError]. It translates its driver's
// errors into them where they apply (a lock wait that ran out is ErrInUse,
// a serialization failure ErrConflict), so that idem answers the client
// without knowing the driver. Any other error (the context's own aside) is
// a failure of the storage, which idem answers UNAVAILABLE so that the
// client retries: a store returns one only where a retry is safe.
//
// # Time
//
// A store tells the time by one clock for everything it keeps and
// compares: an entry's expiry, a lease's end, how long ago a lease ran out.
// Every server that shares the storage must read the same clock, or they
// disagree about whether a lease ran out or an entry expired. Bounded
// waits (for a concurrent claim, a lock, a connection) are measured in real
// time.
//
// # Implementations
//
// Package github.com/idemkit/idem/store/postgres keeps entries in
// PostgreSQL, in the same transaction as the handler's own writes. Package
// github.com/idemkit/idem/store/memory keeps them in the memory of one
// process, for unit tests and single-process demos. Both implement
// [Finishing], [Admin] and [ReplayCounter].
package store
