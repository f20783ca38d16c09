package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// BenchmarkReplayFlush measures a write of the counts of a batch of
// recorded keys, one replay each: what the database does for counting,
// per key.
//
//	go test -run '^$' -bench ReplayFlush -benchmem ./store/postgres/
func BenchmarkReplayFlush(b *testing.B) {
	pool := pgtest.NewPool(b)
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprint(n, "keys"), func(b *testing.B) {
			s := postgres.New(pool, postgres.WithReplayFlush(time.Hour, n))
			keys := make([]store.Scope, n)
			for i := range keys {
				keys[i] = store.Scope{Tenant: "acme", Method: "/svc/M", Key: fmt.Sprint(n, "-", i)}
				c, err := s.Claim(b.Context(), keys[i], store.ClaimRequest{Fingerprint: []byte("fp")})
				if err != nil || c.Txn == nil {
					b.Fatalf("claim: %+v, %v", c, err)
				}
				if err := c.Txn.Record(b.Context(), store.Outcome{Body: []byte("r")}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for _, k := range keys[:n-1] { // the last would start a flush of its own
					s.CountReplay(k)
				}
				if err := s.FlushReplays(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*(n-1)), "µs/key")
		})
	}
}
