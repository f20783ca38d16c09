package readme

import (
	"context"
	"errors"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/idemkit/idem"
	checkoutv1 "github.com/idemkit/idem/examples/gen/checkout/v1"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	providerv1 "github.com/idemkit/idem/examples/gen/provider/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/inbox"
)

// server is the payments server of the usage snippet.
type server struct {
	paymentsv1.UnimplementedPaymentServiceServer
}

// checkout holds the leased-mode snippets.
type checkout struct {
	checkoutv1.UnimplementedCheckoutServiceServer
	provider providerv1.ProviderServiceClient
}

func (c *checkout) Checkout(ctx context.Context, req *checkoutv1.CheckoutRequest) (*checkoutv1.CheckoutResponse, error) {
	provider := c.provider
	amount := req.GetUnitPriceCents() * int64(req.GetQuantity())
	chargeID, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
		resp, err := provider.Charge(ctx, &providerv1.ChargeRequest{CustomerId: req.GetCustomerId(), AmountCents: amount})
		return []byte(resp.GetChargeId()), err
	})
	if err != nil {
		return nil, err
	}
	return &checkoutv1.CheckoutResponse{ChargeId: string(chargeID)}, nil
}

func runFinisher(ctx context.Context, engine *idem.Engine, svc *checkout) error {
	finisher, err := idem.NewFinisher(engine) // the server's engine
	if err != nil {
		return err
	}
	checkoutv1.RegisterCheckoutServiceServer(interceptor.FinisherRegistrar(finisher), svc)
	go finisher.Run(ctx) // every 10 s; abandoned = lease ran out 30 s ago
	return nil
}

func sweep(ctx context.Context, pool *pgxpool.Pool) {
	go postgres.NewSweeper(pool).Run(ctx) // every minute until ctx ends
}

func dial(target string, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(
			interceptor.UnaryClientInterceptor(), // first: one key per logical call
			retry.UnaryClientInterceptor( // go-grpc-middleware v2, after idem
				retry.WithMax(5),
				retry.WithCodes(codes.Aborted, codes.Unavailable),
				retry.WithBackoff(interceptor.BackoffRetryInfo(retry.BackoffExponential(50*time.Millisecond)))),
		))
	return conn, err
}

func consume(ctx context.Context, pool *pgxpool.Pool, msg jetstream.Msg, msgID, orderID string) error {
	in := inbox.New(pool, "shipping") // ids kept 7 days: inbox.WithRetention
	duplicate, err := in.ProcessOnce(ctx, msgID, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, orderID)
		return err
	})
	switch {
	case errors.Is(err, inbox.ErrInvalidMessageID):
		return msg.Term() // an id no delivery can store: dead-letter, never redeliver
	case err != nil:
		return msg.Nak() // not acknowledged: the broker redelivers
	}
	_ = duplicate    // processed now or before, either way:
	return msg.Ack() // acknowledge after the commit
}

// upgraded is the snippet of docs/upgrading.md.
func upgraded(store *postgres.Store, opts []idem.Option) (*grpc.Server, error) {
	engine, err := idem.New(store, opts...) // fails when an option names a method that is not a unary method in the protobuf registry
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))
	return srv, err
}
