package storetest_test

import (
	"testing"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/storetest"
)

// A store of your own passes the same cases as idem's: build a new, empty
// store for each case, with the timing the case asks for and the case's
// clock.
func ExampleRun() {
	testConformance := func(t *testing.T) { // func TestConformance(t *testing.T)
		storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
			return memory.New(memory.WithTTL(cfg.TTL), memory.WithLockTimeout(cfg.LockTimeout), memory.WithClock(cfg.Now))
		})
	}
	_ = testConformance
}
