package main

import (
	"context"
	"os"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"

	shopv1 "example.com/shop/gen/shop/v1"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.Run(m)) // stops the throwaway cluster pgtest may start
}

// TestPlaceOrder calls the handler as gRPC would, through idem's
// interceptor, twice with one key, and finds one order.
func TestPlaceOrder(t *testing.T) {
	pool := pgtest.NewPool(t) // idem's schema, no rows; dropped after the test
	if _, err := pool.Exec(t.Context(), schema); err != nil {
		t.Fatal(err)
	}
	engine, err := idem.New(postgres.New(pool))
	if err != nil {
		t.Fatal(err)
	}
	intercept := interceptor.UnaryServerInterceptor(engine)
	info := &grpc.UnaryServerInfo{FullMethod: shopv1.ShopService_PlaceOrder_FullMethodName}
	handler := func(ctx context.Context, req any) (any, error) {
		return shop{}.PlaceOrder(ctx, req.(*shopv1.PlaceOrderRequest))
	}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(idem.KeyHeader, "order-1"))
	req := &shopv1.PlaceOrderRequest{Sku: "book"}
	var ids []string
	for range 2 { // a call and its retry
		res, err := intercept(ctx, req, info, handler)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.(*shopv1.PlaceOrderResponse).GetOrderId())
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d orders (%v), want 1", n, err)
	}
	if ids[0] != ids[1] {
		t.Fatalf("the retry answered %s, the call %s: want the recorded answer", ids[1], ids[0])
	}
}
