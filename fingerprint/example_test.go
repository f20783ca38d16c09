package fingerprint_test

import (
	"bytes"
	"fmt"
	"log"

	"github.com/idemkit/idem/fingerprint"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// A retry may carry a new trace_id, which is marked
// [(idem.v1.field).fingerprint_exclude = true]: it is still the same request.
func Example() {
	first := &testv1.CreatePaymentRequest{
		CustomerId:  "cus_123",
		AmountCents: 1999,
		Currency:    "EUR",
		TraceId:     "trace-1",
	}
	retry := &testv1.CreatePaymentRequest{
		CustomerId:  "cus_123",
		AmountCents: 1999,
		Currency:    "EUR",
		TraceId:     "trace-2",
	}

	a, err := fingerprint.Sum(first)
	if err != nil {
		log.Fatal(err)
	}
	b, err := fingerprint.Sum(retry)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(bytes.Equal(a, b))
	fmt.Println(len(a), a[0] == fingerprint.Version)
	// Output:
	// true
	// 33 true
}

// A request that reuses a key with another amount is a different request.
func ExampleSum() {
	a, err := fingerprint.Sum(&testv1.CreatePaymentRequest{CustomerId: "cus_123", AmountCents: 1999})
	if err != nil {
		log.Fatal(err)
	}
	b, err := fingerprint.Sum(&testv1.CreatePaymentRequest{CustomerId: "cus_123", AmountCents: 2999})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(bytes.Equal(a, b))
	// Output: false
}

// WithExcludedFields excludes fields of messages whose .proto file cannot be
// annotated. Create the Hasher once and reuse it.
func ExampleWithExcludedFields() {
	h := fingerprint.NewHasher(
		fingerprint.WithExcludedFields("idem.test.v1.CreatePaymentRequest.note"),
	)

	a, err := h.Sum(&testv1.CreatePaymentRequest{CustomerId: "cus_123", Note: "coffee"})
	if err != nil {
		log.Fatal(err)
	}
	b, err := h.Sum(&testv1.CreatePaymentRequest{CustomerId: "cus_123", Note: "coffee and cake"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(bytes.Equal(a, b))
	// Output: true
}
