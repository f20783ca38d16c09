// Package storetest is the conformance suite of idem's stores: one set of
// cases that every implementation of [store.Store] must pass, so that the
// idem behaves the same on each of them.
//
// # Running it
//
// Call [Run] from a test of the store's package, with a function that
// builds an empty store with the timings and the clock of [Config]:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
//			return memory.New(memory.WithTTL(cfg.TTL), memory.WithLockTimeout(cfg.LockTimeout),
//				memory.WithClock(cfg.Now))
//		})
//	}
//
// Each case is a parallel subtest with a store of its own, built with the
// subtest's t: register cleanups (closing a pool, dropping a database) on
// it. A store whose keys outlive the store value (a shared database) must
// hand each case a fresh one, since all cases use the same keys.
//
// # What it covers
//
// Atomic claims ([store.Store.Claim] and [store.Txn]): a free key, replay of
// every kind of outcome (OK, a deterministic error, a response not cached),
// a different fingerprint, Release and what it leaves, Record twice or
// after Release, copies of caller buffers, scoping by tenant, method and
// key, expiry, and concurrency: many claims of one key, a wait that runs
// out, a wait that ends with its context, an owner that releases while
// others wait, many claims of an expired key, and claims of a leased key.
//
// Leased claims ([store.Store.ClaimLeased] and [store.Lease]): a free key,
// a live lease, a run-out lease taken over with its steps (or not, for
// another fingerprint), which takeovers report (and which claims do not),
// Extend, fencing of a stale holder's every write (also after the key was
// released and leased afresh), Record and Release, many takeovers at once,
// expiry, a recorded key, and a lease that waits for an atomic claim.
// Steps: every step kept in the order first saved, a step saved again in
// its place, the bounds, and steps across takeovers.
//
// The optional parts run exactly when the store implements them, as the
// first store built shows; Run logs each that does not apply. Finishing
// ([store.Finishing]): an abandoned lease listed with its kept call, after
// its grace, spaced by its takeovers; a released claim kept for a
// finisher; a recorded or expired call not listed. Operators
// ([store.Admin]): listing by tenant, every tenant, method, state and
// creation time, page after page, and a cursor the store did not make;
// reading a key in each state; Forget and Settle of recorded, abandoned,
// expired and unknown keys; a live lease refused unless forced, and a
// forced action fencing the lease's holder; a status Settle cannot
// record; invalid keys and filters. The audit trail and counts (also
// [store.Admin]): a forget, a settle and a forced forget each keep their
// entry, with the key's states before and after, and a refused action or
// an invalid entry none; a key's history outlives its entry; AuditLog by
// key, method, tenant, every tenant and time range, page after page;
// Stats by tenant, method and state, with the oldest key in progress and
// abandoned; and what the admin service's actions on many keys ask: a
// listing whose cursor goes on, visiting every key once, while the keys
// of its pages are forgotten and settled.
// Replays ([store.ReplayCounter], with
// store.Admin to read them): counts and the last replay's time shown once
// flushed, by Key and Keys; concurrent counts exact; a forgotten key's
// flush a no-op; a key taken over afresh after it expired, atomically or
// leased, starting from none; an entry in progress not counted.
//
// Keys ([store.Scope.Validate]): keys at the length bounds and of non-ASCII
// text are held, in Claim and in ClaimLeased; keys past a bound, not valid
// UTF-8 or with a NUL byte are refused with [store.ErrInvalidScope].
//
// # Time
//
// The store must tell the time by [Config].Now, the case's clock, for
// everything it keeps or compares: a key's expiry, a lease's end, how long
// ago a lease ran out. The clock starts far from the real time and stands
// still until the case moves it forward, so no case sleeps for a key to
// expire or a lease to run out, and none depends on how fast the machine
// is. The lock timeout is real time: the cases that test it wait for it,
// a few hundred milliseconds. Cases that make claims wait for one another
// on what they can observe (every claim called, the owner done), never
// for a fixed time.
package storetest
