package interceptor_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

func ExampleUnaryClientInterceptor() {
	// idem first, retries after it: the key is attached once per logical
	// call, so every attempt below carries the same one. ABORTED (a
	// duplicate still in flight) is retried after the server's RetryInfo.
	conn, err := grpc.NewClient("payments.internal:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(
			interceptor.UnaryClientInterceptor(),
			retry.UnaryClientInterceptor(
				retry.WithMax(5),
				retry.WithCodes(codes.Aborted, codes.Unavailable),
				retry.WithBackoff(interceptor.BackoffRetryInfo(
					retry.BackoffExponentialWithJitter(50*time.Millisecond, 0.2))),
			),
		))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	payments := testv1.NewPaymentServiceClient(conn)
	_ = payments // CreatePayment calls now carry a key; GetPayment calls do not.
}

func ExampleUnaryClientInterceptor_serviceConfig() {
	// grpc-go's own retries happen below every interceptor and resend the
	// metadata idem attached.
	conn, err := grpc.NewClient("payments.internal:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()),
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{
			"name": [{"service": "idem.test.v1.PaymentService"}],
			"retryPolicy": {
				"maxAttempts": 4,
				"initialBackoff": "0.1s",
				"maxBackoff": "2s",
				"backoffMultiplier": 2,
				"retryableStatusCodes": ["ABORTED", "UNAVAILABLE"]
			}
		}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}

func ExampleUnaryClientInterceptor_forwardedMetadata() {
	// A keyed handler that passes its incoming metadata on to the services
	// it calls never forwards its own idempotency key: CreatePayment gets
	// the child key of this request's tenant, method and key for the step
	// "/idem.test.v1.PaymentService/CreatePayment#1", and GetPayment
	// (NO_SIDE_EFFECTS) gets no key.
	var payments testv1.PaymentServiceClient // through UnaryClientInterceptor
	handler := func(ctx context.Context) error {
		md, _ := metadata.FromIncomingContext(ctx)
		out := metadata.NewOutgoingContext(ctx, md)
		created, err := payments.CreatePayment(out,
			&testv1.CreatePaymentRequest{CustomerId: "cus_42", AmountCents: 1250, Currency: "EUR"})
		if err != nil {
			return err
		}
		_, err = payments.GetPayment(out, &testv1.GetPaymentRequest{Id: created.GetPayment().GetId()})
		return err
	}
	_ = handler
}

func ExampleRetryDelay() {
	st, _ := status.New(codes.Aborted, "idempotency key in use").
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)})
	if d, ok := interceptor.RetryDelay(st.Err()); ok {
		fmt.Println("retry in", d)
	}
	// Output: retry in 1.5s
}
