// Package storetest is the conformance suite of idem's stores: one set of
// cases that every implementation of [store.Store] must pass, so that the
// interceptor behaves the same on each of them.
//
// # Running it
//
// Call [Run] from a test of the store's package, with a function that
// builds an empty store with the timings of [Config]:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
//			return memory.New(memory.WithTTL(cfg.TTL), memory.WithLockTimeout(cfg.LockTimeout))
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
// a different fingerprint, Release and what it leaves, Complete twice or
// after Release, copies of caller buffers, scoping by tenant, method and
// key, expiry, and concurrency: many claims of one key, a wait that runs
// out, a wait that ends with its context, an owner that releases while
// others wait, many claims of an expired key, and claims of a leased key.
//
// Leased claims ([store.Store.Lease] and [store.Lease]): a free key, a live
// lease, a run-out lease taken over with its recovery point (or not, for
// another fingerprint), which takeovers report (and which claims do not),
// Extend, fencing of a stale owner's every write
// (also after the key was released and leased afresh), Complete and
// Release, many takeovers at once, expiry, a completed key, and a lease that
// waits for an atomic claim.
//
// Keys ([store.Key.Validate]): keys at the length bounds and of non-ASCII
// text are held, in Claim and in Lease; keys past a bound, not valid UTF-8
// or with a NUL byte are refused with [store.ErrInvalidKey].
//
// The cases wait for leases, expiry and lock timeouts of a few hundred
// milliseconds to a few seconds, with margins meant for busy machines; the
// whole suite takes some seconds of wall time, mostly asleep.
package storetest
