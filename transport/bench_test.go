package transport_test

import (
	"context"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/transport"
)

type keyOf struct{}

// BenchmarkHandle measures what idem's engine costs a call in the
// process, on the memory store, so that no database work is in the
// figures: the handler called directly with a call built as the others
// are (baseline), a first execution in
// each claim mode, and a replay. With providers, the engine is given the
// OpenTelemetry API's no-op meter and tracer providers, which a
// program that sets none gets too (the global ones).
//
//	go test -run '^$' -bench Handle -benchmem ./transport/
func BenchmarkHandle(b *testing.B) {
	handler := func(context.Context) (transport.Reply, error) {
		return transport.Reply{Message: &testv1.CreatePaymentResponse{Payment: &testv1.Payment{Id: "pay_1", CustomerId: "cus_42", AmountCents: 990, Currency: "EUR"}}}, nil
	}
	ctx := context.Background()
	// Each call has a request of its own, as a transport decodes one per
	// call: the engine sets the key into its request_id field.
	call := func(key string) transport.Call {
		return transport.Call{
			Method:  testv1.PaymentService_CreatePayment_FullMethodName,
			Keys:    []string{key},
			Request: &testv1.CreatePaymentRequest{CustomerId: "cus_42", AmountCents: 990, Currency: "EUR"},
			Header:  map[string][]string{idem.KeyHeader: {key}},
		}
	}
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := handler(context.WithValue(ctx, keyOf{}, call("k"))); err != nil {
				b.Fatal(err)
			}
		}
	})
	modes := []idem.Mode{idem.ModeAtomic, idem.ModeOptimistic}
	for _, observed := range []bool{false, true} {
		for _, mode := range modes {
			opts := []idem.Option{idem.WithMethodPolicy(testv1.PaymentService_CreatePayment_FullMethodName, idem.MethodPolicy{Mode: mode})}
			name := string(mode)
			if observed {
				opts = append(opts, idem.WithMeterProvider(noop.NewMeterProvider()), idem.WithTracerProvider(tracenoop.NewTracerProvider()))
				name += "/noop-providers"
			}
			e, err := idem.New(memory.New(), opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.Run("first/"+name, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					if _, err := transport.Handle(ctx, e, call(name+strconv.Itoa(i)), handler); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("replay/"+name, func(b *testing.B) {
				if _, err := transport.Handle(ctx, e, call("replayed"), handler); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					a, err := transport.Handle(ctx, e, call("replayed"), handler)
					if err != nil || a.Result != idem.ResultReplayed {
						b.Fatal(a.Result, err)
					}
				}
			})
		}
	}
}
