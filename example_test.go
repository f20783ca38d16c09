package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// New checks the per-method options against the protobuf registry, so a
// misspelt method fails at start-up rather than being ignored. The memory
// store keeps idem's contract within one process (tests, a single
// replica); production servers use store/postgres.
func ExampleNew() {
	_, err := idem.New(memory.New(), idem.WithLeased(time.Minute, "/test.v1.TestService/Doo"))
	fmt.Println(err != nil)

	e, err := idem.New(memory.New(), idem.WithLeased(time.Minute, testv1.TestService_Do_FullMethodName))
	if err != nil {
		log.Fatal(err)
	}
	_ = e // hand it to the adapters: interceptor.UnaryServerInterceptor(e), idemconnect.NewInterceptor(e)
	// Output: true
}

// A transport's adapter hands Handle each unary call and sends back what it
// returns. This one is called directly with a key and a request: a call, a
// retry of it, and a reuse of its key for another request.
func ExampleEngine_Handle() {
	e, err := idem.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	executions := 0
	call := func(key, value string) {
		req := &testv1.MaybeRequest{Value: value}
		ans, err := e.Handle(context.Background(), idem.Call{
			Method:  testv1.TestService_Maybe_FullMethodName,
			Keys:    []string{key},
			Request: req,
			Header:  map[string][]string{idem.KeyHeader: {key}},
		}, func(ctx context.Context) (idem.Reply, error) {
			executions++
			return idem.Reply{Message: &testv1.MaybeResponse{Value: req.GetValue(), Execution: int64(executions)}}, nil
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

// Scope keys by the authenticated caller. A real server reads the identity
// its authentication interceptor verified; this stand-in trusts a header.
// The same key from two tenants names two operations.
func ExampleWithTenant() {
	tenant := func(ctx context.Context, header map[string][]string) (string, error) {
		if v := header["x-tenant-id"]; len(v) == 1 {
			return v[0], nil
		}
		return "", fmt.Errorf("no tenant")
	}
	e, err := idem.New(memory.New(), idem.WithTenant(tenant))
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range []string{"acme", "globex", "acme"} {
		ans, _ := e.Handle(context.Background(), idem.Call{
			Method:  testv1.TestService_Maybe_FullMethodName,
			Keys:    []string{"order-1"},
			Request: &testv1.MaybeRequest{Value: "10 EUR"},
			Header:  map[string][]string{"x-tenant-id": {t}},
		}, func(ctx context.Context) (idem.Reply, error) {
			return idem.Reply{Message: &testv1.MaybeResponse{Value: t}}, nil
		})
		fmt.Println(t, ans.Result)
	}
	// Output:
	// acme executed
	// globex executed
	// acme replayed
}

func ExampleWithClassifier() {
	// Record and replay PERMISSION_DENIED too, on top of the defaults.
	classify := func(s *spb.Status) bool {
		switch code.Code(s.GetCode()) {
		case code.Code_PERMISSION_DENIED, // and the defaults:
			code.Code_INVALID_ARGUMENT, code.Code_FAILED_PRECONDITION, code.Code_OUT_OF_RANGE,
			code.Code_ALREADY_EXISTS, code.Code_NOT_FOUND:
			return true
		}
		return false
	}
	_ = idem.WithClassifier(classify)
}

func ExampleKeyFromContext() {
	handler := func(ctx context.Context) {
		if key, ok := idem.KeyFromContext(ctx); ok {
			fmt.Println("handling", key)
		}
	}
	_ = handler
}

func ExampleValidateKey() {
	fmt.Println(idem.ValidateKey("2f1c6b0e-4a53-4f5e-9b7a-1d2c3e4f5a6b"))
	fmt.Println(idem.ValidateKey("has space"))
	// Output:
	// <nil>
	// must be visible ASCII (0x21-0x7E), got byte 0x20 at offset 3
}

func ExampleDeriveKey() {
	// The payment provider gets its own key for the "charge" step of the
	// Checkout request that tenant acme keyed "order-7f3a", the same on
	// every retry of that request and different from the children of
	// "order-7f3a" in any other tenant or method.
	parent := store.Scope{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-7f3a"}
	fmt.Println(idem.DeriveKey(parent, "charge"))
	// Output: b710463d8d6589451baefeda0a9ef1576c53787e46f30a8113f2f406ab1d7774
}

func ExampleChildKey() {
	// A keyed handler that charges a provider over HTTP sends the child key
	// of its "charge" step, so that a retried request charges once.
	handler := func(ctx context.Context, charge *http.Request) (*http.Response, error) {
		key, ok := idem.ChildKey(ctx, "charge")
		if !ok {
			return nil, errors.New("not a keyed request")
		}
		charge.Header.Set("Idempotency-Key", key)
		return http.DefaultClient.Do(charge.WithContext(ctx))
	}
	_ = handler
}

// OutgoingKeys is what the client adapters (interceptor.UnaryClientInterceptor,
// idemconnect's interceptor) call for each outgoing call; a client over
// another transport calls it the same way and sends the request and the
// keys it returns.
func ExampleOutgoingKeys() {
	keys := idem.NewOutgoingKeys()
	req := &testv1.CreatePaymentRequest{CustomerId: "cus_42", AmountCents: 990, Currency: "EUR"}

	// Outside a keyed handler, a call the caller keyed itself keeps its key.
	// CreatePaymentRequest carries its key in request_id, marked
	// (idem.v1.field).key: the request to send is a copy with the key
	// there too, and the caller's message is left as it was.
	ctx := idem.ContextWithKey(context.Background(), "invoice-2024-0042")
	send, k, err := keys.For(ctx, testv1.PaymentService_CreatePayment_FullMethodName, req, nil)
	fmt.Println(k, err)
	fmt.Printf("%q %q\n", send.(*testv1.CreatePaymentRequest).GetRequestId(), req.GetRequestId())

	// A key the caller set that is not a key fails the call before it is sent.
	_, _, err = keys.For(idem.ContextWithKey(context.Background(), "has space"),
		testv1.PaymentService_CreatePayment_FullMethodName, req, nil)
	fmt.Println(err)
	// Output:
	// [invoice-2024-0042] <nil>
	// "invoice-2024-0042" ""
	// INVALID_ARGUMENT: idem: key set with ContextWithKey: must be visible ASCII (0x21-0x7E), got byte 0x20 at offset 3
}

func ExampleContextWithKey() {
	// A key the caller stored with its own record before calling, so that
	// the call made after a crash and restart repeats the first one.
	ctx := idem.ContextWithKey(context.Background(), "invoice-2024-0042")
	_, keys, _ := idem.NewOutgoingKeys().For(ctx, testv1.PaymentService_CreatePayment_FullMethodName,
		&testv1.CreatePaymentRequest{CustomerId: "cus_42", AmountCents: 990, Currency: "EUR"}, nil)
	fmt.Println(keys)
	// Output: [invoice-2024-0042]
}

func ExampleContextWithStep() {
	// Inside a keyed handler, name the steps whose order may vary; here two
	// charges run concurrently, so per-method ordinals would not be stable
	// across a retry of the request. Each charge carries the request's
	// child key for its step, idem.ChildKey(ctx, step).
	e, err := idem.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	outgoing := idem.NewOutgoingKeys() // as the client adapters hold it
	charge := func(ctx context.Context, cents int64) []string {
		_, keys, _ := outgoing.For(ctx, testv1.PaymentService_CreatePayment_FullMethodName,
			&testv1.CreatePaymentRequest{CustomerId: "cus_42", AmountCents: cents, Currency: "EUR"}, nil)
		return keys // sent with the call
	}
	_, _ = e.Handle(context.Background(), idem.Call{
		Method:  testv1.TestService_Maybe_FullMethodName,
		Keys:    []string{"order-1"},
		Request: &testv1.MaybeRequest{Value: "checkout"},
	}, func(ctx context.Context) (idem.Reply, error) {
		goods := make(chan []string)
		go func() { goods <- charge(idem.ContextWithStep(ctx, "charge-goods"), 1250) }()
		shipping := charge(idem.ContextWithStep(ctx, "charge-shipping"), 490)
		want, _ := idem.ChildKey(ctx, "charge-goods")
		fmt.Println((<-goods)[0] == want, len(shipping))
		return idem.Reply{Message: &testv1.MaybeResponse{}}, nil
	})
	// Output: true 1
}

func ExampleWithLeased() {
	// Checkout calls a payment provider, which no database transaction can
	// roll back: hold its keys with a two-minute lease instead.
	_ = idem.WithLeased(2*time.Minute, "/shop.v1.Shop/Checkout")
}

func ExampleWithOptimistic() {
	// CreatePayment writes only through the claim's transaction and is
	// rarely retried: let its first executions skip the read of the key,
	// and its retries pay a rolled-back run of the handler instead.
	_ = idem.WithOptimistic("/payments.v1.PaymentService/CreatePayment")
}

func ExampleStep() {
	// A leased handler that charges a provider once per key, even when a
	// retry takes over from a worker that crashed after the charge: the
	// step's saved result is returned without charging again.
	charge := func(ctx context.Context) (string, error) { return "ch_1", nil }
	handler := func(ctx context.Context) error {
		chargeID, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
			// The provider's call carries ChildKey(ctx, "charge").
			id, err := charge(ctx)
			return []byte(id), err
		})
		if err != nil {
			return err
		}
		// ... confirm the order with chargeID.
		_ = chargeID
		return nil
	}
	_ = handler
}

// A call whose worker died after its charge step is finished by a
// Finisher, which runs the handler again past the saved step; the caller's
// retry then replays the outcome. Over gRPC, interceptor.FinisherRegistrar
// does the registering.
func ExampleNewFinisher() {
	e, err := idem.New(memory.New(),
		idem.WithLeased(time.Minute, testv1.TestService_Do_FullMethodName),
		idem.WithFinish(testv1.TestService_Do_FullMethodName))
	if err != nil {
		log.Fatal(err)
	}
	charges, runs := 0, 0
	handler := func(req *testv1.DoRequest) idem.Handler {
		return func(ctx context.Context) (idem.Reply, error) {
			runs++
			id, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
				charges++
				return []byte("ch_1"), nil
			})
			if err != nil {
				return idem.Reply{}, err
			}
			if runs == 1 {
				return idem.Reply{}, errors.New("the worker died") // transient: the claim stays for a takeover
			}
			return idem.Reply{Message: &testv1.DoResponse{Value: string(id)}}, nil
		}
	}
	call := func(ctx context.Context, req *testv1.DoRequest, header map[string][]string) (idem.Answer, error) {
		return e.Handle(ctx, idem.Call{
			Method:  testv1.TestService_Do_FullMethodName,
			Keys:    header[idem.KeyHeader],
			Request: req,
			Header:  header,
		}, handler(req))
	}

	f, err := idem.NewFinisher(e, idem.FinisherConfig{Grace: -1}) // no grace, for the example
	if err != nil {
		log.Fatal(err)
	}
	f.Handle(testv1.TestService_Do_FullMethodName, func(ctx context.Context, req proto.Message, header map[string][]string) error {
		_, err := call(ctx, req.(*testv1.DoRequest), header)
		return err
	})

	header := map[string][]string{idem.KeyHeader: {"order-1"}}
	_, err = call(context.Background(), &testv1.DoRequest{Value: "10 EUR"}, header)
	fmt.Println("caller:", err)
	n, err := f.Finish(context.Background()) // Run does this every Interval
	fmt.Println("finished:", n, err)
	ans, _ := call(context.Background(), &testv1.DoRequest{Value: "10 EUR"}, header)
	fmt.Println("retry:", ans.Result, ans.Message.(*testv1.DoResponse).GetValue())
	fmt.Println("charges:", charges)
	// Output:
	// caller: the worker died
	// finished: 1 <nil>
	// retry: replayed ch_1
	// charges: 1
}

// paymentLoader records a payment's id in place of a large response and
// reads the payment back for a retry.
type paymentLoader struct {
	get func(ctx context.Context, id string) (*testv1.Payment, error)
}

func (l paymentLoader) Reference(_ context.Context, resp proto.Message) ([]byte, error) {
	return []byte(resp.(*testv1.CreatePaymentResponse).GetPayment().GetId()), nil
}

func (l paymentLoader) Load(ctx context.Context, ref []byte) (proto.Message, error) {
	p, err := l.get(ctx, string(ref))
	if err != nil {
		return nil, err
	}
	return &testv1.CreatePaymentResponse{Payment: p}, nil
}

func ExampleWithLoader() {
	var loader idem.Loader = paymentLoader{}
	_ = []idem.Option{
		idem.WithMaxStoredResponseBytes(64 << 10),
		idem.WithLoader(testv1.PaymentService_CreatePayment_FullMethodName, loader),
	}
}
