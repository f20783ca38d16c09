package postgres_test

import (
	"testing"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
	"github.com/idemkit/idem/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		return postgres.New(pgtest.NewPool(t),
			postgres.WithTTL(cfg.TTL), postgres.WithLockTimeout(cfg.LockTimeout), postgres.WithClock(cfg.Now))
	})
}
