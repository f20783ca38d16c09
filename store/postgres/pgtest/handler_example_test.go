package pgtest_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

// createPayment stands for your handler: it writes on the transaction that
// holds the request's idempotency key.
func createPayment(ctx context.Context, req any) (any, error) {
	tx, _ := postgres.TxFromContext(ctx)
	r := req.(*testv1.CreatePaymentRequest)
	var id string
	err := tx.QueryRow(ctx, `INSERT INTO payments (customer, amount) VALUES ($1, $2) RETURNING id::text`,
		r.GetCustomerId(), r.GetAmountCents()).Scan(&id)
	if err != nil {
		return nil, err
	}
	return &testv1.CreatePaymentResponse{Payment: &testv1.Payment{Id: id}}, nil
}

// testCreatePayment is the test of your handler, TestCreatePayment in your
// package: it calls the interceptor as gRPC would, twice with one key, and
// finds one payment.
func testCreatePayment(t *testing.T) {
	pool := pgtest.NewPool(t) // idem's schema, no rows; dropped after the test
	if _, err := pool.Exec(t.Context(), `CREATE TABLE payments (id bigserial PRIMARY KEY, customer text, amount bigint)`); err != nil {
		t.Fatal(err)
	}
	engine, err := idem.New(postgres.New(pool))
	if err != nil {
		t.Fatal(err)
	}
	intercept := interceptor.UnaryServerInterceptor(engine)
	info := &grpc.UnaryServerInfo{FullMethod: testv1.PaymentService_CreatePayment_FullMethodName}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(idem.KeyHeader, "order-1"))
	req := &testv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 1250}
	for range 2 { // a call and its retry
		if _, err := intercept(ctx, req, info, createPayment); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM payments`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d payments (%v), want 1", n, err)
	}
}

// A handler that writes on postgres.TxFromContext is tested as it runs in
// production: through the interceptor, on a database of the test's own
// (store/memory has no transaction to give it).
func Example_handlerTest() {
	_ = testCreatePayment // run by go test, as TestCreatePayment
}
