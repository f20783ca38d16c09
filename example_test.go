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
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/transport"
)

// New checks the per-method options against the protobuf registry, so a
// misspelt method fails at start-up rather than being ignored. The memory
// store keeps idem's contract within one process (tests, a single
// replica); production servers use store/postgres.
func ExampleNew() {
	_, err := idem.New(memory.New(), idem.WithMethodPolicy("/test.v1.TestService/Doo", idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute}))
	fmt.Println(err != nil)

	e, err := idem.New(memory.New(), idem.WithMethodPolicy(testv1.TestService_Do_FullMethodName, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute}))
	if err != nil {
		log.Fatal(err)
	}
	_ = e // hand it to the adapters: interceptor.UnaryServerInterceptor(e), idemconnect.NewInterceptor(e)
	// Output: true
}

// Scope keys by the authenticated caller. A real server reads the identity
// its authentication interceptor verified; this stand-in trusts a header.
// The same key from two tenants names two operations. The calls go
// through transport.Handle, as an adapter hands them to the engine.
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
		ans, _ := transport.Handle(context.Background(), e, transport.Call{
			Method:  testv1.TestService_Maybe_FullMethodName,
			Keys:    []string{"order-1"},
			Request: &testv1.MaybeRequest{Value: "10 EUR"},
			Header:  map[string][]string{"x-tenant-id": {t}},
		}, func(ctx context.Context) (transport.Reply, error) {
			return transport.Reply{Message: &testv1.MaybeResponse{Value: t}}, nil
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

func ExampleContextWithKey() {
	// A key the caller stored with its own record before calling, so that
	// the call made after a crash and restart repeats the first one.
	ctx := idem.ContextWithKey(context.Background(), "invoice-2024-0042")
	_, keys, _, _ := transport.NewOutgoingKeys().For(ctx, testv1.PaymentService_CreatePayment_FullMethodName,
		&testv1.CreatePaymentRequest{CustomerId: "cus_42", AmountCents: 990, Currency: "EUR"}, nil)
	fmt.Println(keys)
	// Output: [invoice-2024-0042]
}

// Inside a keyed handler, calls whose order may vary between runs of the
// handler carry keys of their own: here two charges run concurrently, so
// per-method ordinals would not be stable across a retry of the request.
// Each charge carries the request's child key for its step.
func ExampleChildKey_concurrentCalls() {
	e, err := idem.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	outgoing := transport.NewOutgoingKeys() // as the client adapters hold it
	charge := func(ctx context.Context, step string, cents int64) []string {
		key, _ := idem.ChildKey(ctx, step)
		_, keys, _, _ := outgoing.For(idem.ContextWithKey(ctx, key), testv1.PaymentService_CreatePayment_FullMethodName,
			&testv1.CreatePaymentRequest{CustomerId: "cus_42", AmountCents: cents, Currency: "EUR"}, nil)
		return keys // sent with the call
	}
	_, _ = transport.Handle(context.Background(), e, transport.Call{
		Method:  testv1.TestService_Maybe_FullMethodName,
		Keys:    []string{"order-1"},
		Request: &testv1.MaybeRequest{Value: "checkout"},
	}, func(ctx context.Context) (transport.Reply, error) {
		goods := make(chan []string)
		go func() { goods <- charge(ctx, "charge-goods", 1250) }()
		shipping := charge(ctx, "charge-shipping", 490)
		want, _ := idem.ChildKey(ctx, "charge-goods")
		fmt.Println((<-goods)[0] == want, len(shipping))
		return transport.Reply{Message: &testv1.MaybeResponse{}}, nil
	})
	// Output: true 1
}

func ExampleWithMethodPolicy() {
	_ = []idem.Option{
		// Checkout calls a payment provider, which no database transaction
		// can roll back: hold its keys with a two-minute lease instead, and
		// let a Finisher finish the calls whose callers are gone, with the
		// caller's user id kept for the handler.
		idem.WithMethodPolicy("/shop.v1.Shop/Checkout", idem.MethodPolicy{
			KeyRequired:   true,
			Mode:          idem.ModeLeased,
			Lease:         2 * time.Minute,
			Finish:        true,
			FinishHeaders: []string{"x-user-id"},
		}),
		// CreatePayment writes only through the claim's transaction and is
		// rarely retried: let its first executions skip the read of the
		// key, and its retries pay a rolled-back run of the handler
		// instead.
		idem.WithMethodPolicy("/payments.v1.PaymentService/CreatePayment", idem.MethodPolicy{
			KeyRequired: true,
			Mode:        idem.ModeOptimistic,
		}),
	}
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
// retry then replays the outcome. The calls go through transport.Handle
// and transport.RegisterFinish, as an adapter runs them; over gRPC,
// interceptor.FinisherRegistrar does the registering.
func ExampleNewFinisher() {
	e, err := idem.New(memory.New(),
		idem.WithMethodPolicy(testv1.TestService_Do_FullMethodName, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute, Finish: true}))
	if err != nil {
		log.Fatal(err)
	}
	charges, runs := 0, 0
	handler := func(req *testv1.DoRequest) transport.Handler {
		return func(ctx context.Context) (transport.Reply, error) {
			runs++
			id, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
				charges++
				return []byte("ch_1"), nil
			})
			if err != nil {
				return transport.Reply{}, err
			}
			if runs == 1 {
				return transport.Reply{}, errors.New("the worker died") // transient: the claim stays for a takeover
			}
			return transport.Reply{Message: &testv1.DoResponse{Value: string(id)}}, nil
		}
	}
	call := func(ctx context.Context, req *testv1.DoRequest, header map[string][]string) (transport.Answer, error) {
		return transport.Handle(ctx, e, transport.Call{
			Method:  testv1.TestService_Do_FullMethodName,
			Keys:    header[idem.KeyHeader],
			Request: req,
			Header:  header,
		}, handler(req))
	}

	f, err := idem.NewFinisher(e, idem.WithGrace(0)) // no grace, for the example
	if err != nil {
		log.Fatal(err)
	}
	transport.RegisterFinish(f, testv1.TestService_Do_FullMethodName, func(ctx context.Context, e *idem.Engine, req proto.Message, header map[string][]string) error {
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

func ExampleLoader() {
	var loader idem.Loader = paymentLoader{}
	_ = []idem.Option{
		idem.WithMaxStoredResponseBytes(64 << 10),
		idem.WithMethodPolicy(testv1.PaymentService_CreatePayment_FullMethodName, idem.MethodPolicy{KeyRequired: true, Loader: loader}),
	}
}
