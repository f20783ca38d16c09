package interceptor_test

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

func ExampleWithLeased() {
	// Checkout calls a payment provider, which no database transaction can
	// roll back: hold its keys with a two-minute lease instead.
	_ = idem.WithLeased(2*time.Minute, "/shop.v1.Shop/Checkout")
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
