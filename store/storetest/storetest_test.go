package storetest_test

import (
	"testing"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/storetest"
)

// TestOptionalPartsAreOptional: a store of claims alone, which implements
// neither store.Finishing nor store.Admin, passes the suite: the cases of
// the parts it does not implement do not apply.
func TestOptionalPartsAreOptional(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		return struct{ store.Store }{memory.New(memory.WithTTL(cfg.TTL), memory.WithLockTimeout(cfg.LockTimeout), memory.WithClock(cfg.Now))}
	})
}
