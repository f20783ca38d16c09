package store_test

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/store"
)

// Every store refuses a key it cannot hold with ErrInvalidScope before it
// touches its storage; Validate tells the same in advance.
func ExampleScope_Validate() {
	ok := store.Scope{Tenant: "acme", Method: "/payments.v1.PaymentService/CreatePayment", Key: "order-1"}
	fmt.Println(ok.Validate())

	long := ok
	long.Tenant = strings.Repeat("t", store.MaxTenantLength+1)
	err := long.Validate()
	fmt.Println(errors.Is(err, store.ErrInvalidScope))
	// Output:
	// <nil>
	// true
}

// A leased handler's steps are validated the same way by every
// store.
func ExampleStep_Validate() {
	fmt.Println(store.Step{Name: "charge_sent", Result: []byte("ch_1")}.Validate())
	err := store.Step{Name: "bad\x00step"}.Validate()
	fmt.Println(errors.Is(err, store.ErrInvalidStep))
	// Output:
	// <nil>
	// true
}
