package main

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
)

// TestReadmeServer checks what the README says of its server: a call with
// a key creates a payment, its retry gets the same payment back marked
// replayed, the key with another amount is refused FAILED_PRECONDITION and
// a call without a key INVALID_ARGUMENT.
func TestReadmeServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		lis.Close()
		if err := <-served; err == nil {
			t.Error("serve returned no error once its listener was closed")
		}
	})
	client := paymentsv1.NewPaymentServiceClient(conn)
	create := func(key string, amount int64) (*paymentsv1.CreatePaymentResponse, metadata.MD, error) {
		ctx := t.Context()
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, key)
		}
		var header metadata.MD
		res, err := client.CreatePayment(ctx, &paymentsv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: amount}, grpc.Header(&header))
		return res, header, err
	}

	first, header, err := create("order-1", 1250)
	if err != nil {
		t.Fatal(err)
	}
	if first.GetPayment().GetId() == "" || len(header.Get(idem.ReplayedHeader)) != 0 {
		t.Fatalf("the first call got %v with header %v, want a new payment, not replayed", first, header)
	}
	retry, header, err := create("order-1", 1250)
	if err != nil {
		t.Fatal(err)
	}
	if retry.GetPayment().GetId() != first.GetPayment().GetId() {
		t.Errorf("the retry got payment %s, want the first call's %s", retry.GetPayment().GetId(), first.GetPayment().GetId())
	}
	if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Errorf("the retry's %s header is %v, want true", idem.ReplayedHeader, got)
	}
	for _, c := range []struct {
		name, key string
		want      codes.Code
	}{
		{"the key with another amount", "order-1", codes.FailedPrecondition},
		{"no key", "", codes.InvalidArgument},
	} {
		if _, _, err := create(c.key, 9900); status.Code(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
}
