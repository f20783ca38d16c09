// Package store defines what idem's engine needs from the storage
// that holds idempotency keys, and the errors every implementation reports.
//
// # Contract
//
// A key is scoped by tenant, full gRPC method and the client's key string
// ([Scope]). Every store holds the keys that [Scope.Validate] accepts (bounded
// lengths, valid UTF-8, no NUL byte) and refuses the others in Claim and
// ClaimLeased with [ErrInvalidScope] before it touches its storage, so that a
// key works on every store or on none.
//
// [Store.Claim] is the only way to learn whether a key is free, and it must
// decide atomically: of any number of concurrent claims for one key,
// exactly one gets a [Txn]; the others get the key's [Entry] once the owner
// is done, or [ErrInUse] when a bounded wait runs out. "Check, then
// insert" is not an implementation of Claim.
//
// The owner ends its Txn with [Txn.Record], which records the outcome so
// that later claims see a recorded [Entry], or with [Txn.Release], which
// leaves no trace so that a retry runs afresh. A key whose entry has expired
// counts as absent and can be claimed again.
//
// [Store.ClaimLeased] is the claim of leased mode, for handlers whose side effects
// leave the storage: it is durable at once and held for a lease, guarded by
// a fencing token that changes with every owner. While the lease runs, other
// claims see an in-progress [Entry] with its remaining time; once it has run
// out, a claim with the same fingerprint takes the key over, keeping the
// steps saved under it ([Step]), and every later write of the earlier owner's
// [Lease] fails with [ErrLeaseLost] and changes nothing.
//
// [Admin] is implemented by stores that let an operator list their keys
// ([KeyFilter], [KeyInfo], [State]), read one, forget one so that its
// next request runs afresh, and settle one stuck in progress with an
// outcome its retries replay. Forget and Settle refuse a live lease with a
// [*LeaseLiveError] unless forced; a forced one fences the lease's holder,
// whose later writes fail with [ErrLeaseLost].
//
// Implementations translate their driver's errors into the sentinel errors
// of this package ([ErrInUse], [ErrConflict], [ErrLeaseLost],
// [ErrInvalidScope]) so that callers can choose a gRPC status without knowing
// the driver.
//
// # Implementations
//
// Package github.com/idemkit/idem/store/postgres stores keys in PostgreSQL,
// in the same transaction as the handler's own writes. Package
// github.com/idemkit/idem/store/memory keeps them in the memory of one
// process, for unit tests and single-process demos. Both implement
// [Finishing] and [Admin].
//
// Package github.com/idemkit/idem/store/storetest is the conformance suite
// that every implementation passes.
package store
