package memory_test

import (
	"testing"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		return memory.New(memory.WithTTL(cfg.TTL), memory.WithLockTimeout(cfg.LockTimeout), memory.WithClock(cfg.Now))
	})
}
