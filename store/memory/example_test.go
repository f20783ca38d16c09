package memory_test

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

func Example() {
	ctx := context.Background()
	s := memory.New(memory.WithTTL(time.Hour))
	key := store.Scope{Tenant: "acme", Method: "/payments.v1.Payments/Charge", Key: "order-42"}
	fingerprint := []byte("request hash")

	// The first request claims the key, runs and records its response.
	c, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: fingerprint})
	if err != nil {
		panic(err)
	}
	defer c.Txn.Release(ctx) // does nothing after Record
	fmt.Println("first request owns the key:", c.Txn != nil)
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: []byte("charge ch_1")}); err != nil {
		panic(err)
	}

	// A retry finds the recorded outcome and replays it.
	retry, err := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: fingerprint})
	if err != nil {
		panic(err)
	}
	e := retry.Entry
	fmt.Println("retry owns the key:", retry.Txn != nil)
	fmt.Println("replay:", e.State == store.Recorded, e.Outcome.Code, string(e.Outcome.Body))
	// Output:
	// first request owns the key: true
	// retry owns the key: false
	// replay: true OK charge ch_1
}

func ExampleWithClock() {
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := memory.New(
		memory.WithTTL(24*time.Hour),
		memory.WithClock(func() time.Time { return now }), // not concurrent here
	)
	key := store.Scope{Tenant: "acme", Method: "/payments.v1.Payments/Charge", Key: "order-42"}

	c, _ := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	_ = c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK})

	now = now.Add(25 * time.Hour) // past the TTL: the key counts as absent
	again, _ := s.Claim(ctx, key, store.ClaimRequest{Fingerprint: []byte("fp")})
	fmt.Println("runs again after expiry:", again.Txn != nil)
	// Output:
	// runs again after expiry: true
}
