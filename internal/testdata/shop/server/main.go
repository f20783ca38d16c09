// Binary server is a buf user's service with idem: it serves PlaceOrder,
// marked (idem.v1.method).key_required in shop.proto, calls it over
// loopback, and exits non-zero unless idem read that option at run time.
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/memory"

	shopv1 "example.com/shop/gen/shop/v1"
)

type shop struct {
	shopv1.UnimplementedShopServiceServer
	orders int
}

func (s *shop) PlaceOrder(ctx context.Context, req *shopv1.PlaceOrderRequest) (*shopv1.PlaceOrderResponse, error) {
	s.orders++
	return &shopv1.PlaceOrderResponse{OrderId: fmt.Sprintf("order-%d", s.orders)}, nil
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ok: idem read (idem.v1.method) from shop.proto")
}

func run() error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	svc := &shop{}
	engine, err := idem.New(memory.New())
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))
	shopv1.RegisterShopServiceServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := shopv1.NewShopServiceClient(conn)
	ctx := context.Background()

	// key_required: without a key the call must be refused.
	_, err = client.PlaceOrder(ctx, &shopv1.PlaceOrderRequest{Sku: "book"})
	if status.Code(err) != codes.InvalidArgument {
		return fmt.Errorf("a call without a key got %v, want InvalidArgument: the option was not read", err)
	}
	keyed := metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, "order-1")
	first, err := client.PlaceOrder(keyed, &shopv1.PlaceOrderRequest{Sku: "book", TraceId: "a"})
	if err != nil {
		return fmt.Errorf("first call: %v", err)
	}
	var header metadata.MD
	retry, err := client.PlaceOrder(keyed, &shopv1.PlaceOrderRequest{Sku: "book", TraceId: "b"}, grpc.Header(&header))
	if err != nil {
		return fmt.Errorf("retry: %v", err)
	}
	if retry.GetOrderId() != first.GetOrderId() || svc.orders != 1 {
		return fmt.Errorf("retry got %q after %q and %d orders, want a replay of one order: fingerprint_exclude was not read",
			retry.GetOrderId(), first.GetOrderId(), svc.orders)
	}
	if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		return fmt.Errorf("retry's %s header is %q, want true", idem.ReplayedHeader, got)
	}
	if os.Getenv("GOLANG_PROTOBUF_REGISTRATION_CONFLICT") != "panic" {
		return fmt.Errorf("run with GOLANG_PROTOBUF_REGISTRATION_CONFLICT=panic, so that a file registered twice fails")
	}
	return nil
}
