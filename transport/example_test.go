package transport_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/transport"
)

// An adapter hands Handle each unary call and sends back what it returns.
// This one is called directly with a key and a request: a call, a retry of
// it, and a reuse of its key for another request.
func ExampleHandle() {
	e, err := idem.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	executions := 0
	call := func(key, value string) {
		req := &testv1.MaybeRequest{Value: value}
		ans, err := transport.Handle(context.Background(), e, transport.Call{
			Method:  testv1.TestService_Maybe_FullMethodName,
			Keys:    []string{key},
			Request: req,
			Header:  map[string][]string{idem.KeyHeader: {key}},
		}, func(ctx context.Context) (transport.Reply, error) {
			executions++
			return transport.Reply{Message: &testv1.MaybeResponse{Value: req.GetValue(), Execution: int64(executions)}}, nil
		})
		var ie *idem.Error
		if errors.As(err, &ie) {
			fmt.Println(ans.Result, code.Code(ie.Status().GetCode()))
			return
		}
		fmt.Println(ans.Result, ans.Message.(*testv1.MaybeResponse).GetExecution(), ans.Header[idem.ReplayedHeader])
	}
	call("order-1", "10 EUR")
	call("order-1", "10 EUR") // a retry: replayed
	call("order-1", "99 EUR") // the same key for another request
	fmt.Println("executions:", executions)
	// Output:
	// executed 1 []
	// replayed 1 [true]
	// reused FAILED_PRECONDITION
	// executions: 1
}

func ExampleValidateKey() {
	fmt.Println(transport.ValidateKey("2f1c6b0e-4a53-4f5e-9b7a-1d2c3e4f5a6b"))
	fmt.Println(transport.ValidateKey("has space"))
	// Output:
	// <nil>
	// must be visible ASCII (0x21-0x7E), got byte 0x20 at offset 3
}

// OutgoingKeys is what the client adapters (interceptor.UnaryClientInterceptor,
// idemconnect's interceptor) call for each outgoing call; a client over
// another transport calls it the same way and sends the request and the
// keys it returns.
func ExampleOutgoingKeys() {
	keys := transport.NewOutgoingKeys()
	req := &testv1.CreatePaymentRequest{CustomerId: "cus_42", AmountCents: 990, Currency: "EUR"}

	// Outside a keyed handler, a call the caller keyed itself keeps its key.
	// CreatePaymentRequest carries its key in request_id, marked
	// (idem.v1.field).key: the request to send is a copy with the key
	// there too, and the caller's message is left as it was.
	ctx := idem.ContextWithKey(context.Background(), "invoice-2024-0042")
	send, k, _, err := keys.For(ctx, testv1.PaymentService_CreatePayment_FullMethodName, req, nil)
	fmt.Println(k, err)
	fmt.Printf("%q %q\n", send.(*testv1.CreatePaymentRequest).GetRequestId(), req.GetRequestId())

	// A key the caller set that is not a key fails the call before it is sent.
	_, _, _, err = keys.For(idem.ContextWithKey(context.Background(), "has space"),
		testv1.PaymentService_CreatePayment_FullMethodName, req, nil)
	fmt.Println(err)
	// Output:
	// [invoice-2024-0042] <nil>
	// "invoice-2024-0042" ""
	// INVALID_ARGUMENT: idem: key set with ContextWithKey: must be visible ASCII (0x21-0x7E), got byte 0x20 at offset 3
}

func ExampleStreamKeyRefused() {
	err := transport.StreamKeyRefused("/shop.v1.Shop/Watch")
	fmt.Println(err)
	// Output: INVALID_ARGUMENT: idem: invalid idempotency key: idempotency keys apply to unary methods, and /shop.v1.Shop/Watch streams
}
