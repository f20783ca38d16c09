// Binary quickstart demonstrates the README's server: the payments service
// over gRPC, on the memory store, with idem's interceptor in front of it.
package main

import (
	"context"
	"log"
	"net"

	"github.com/google/uuid"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/memory"
)

type payments struct {
	paymentsv1.UnimplementedPaymentServiceServer
}

// CreatePayment runs once per key: a retry gets this answer back.
func (payments) CreatePayment(ctx context.Context, req *paymentsv1.CreatePaymentRequest) (*paymentsv1.CreatePaymentResponse, error) {
	return &paymentsv1.CreatePaymentResponse{Payment: &paymentsv1.Payment{
		Id: uuid.NewString(), CustomerId: req.GetCustomerId(), AmountCents: req.GetAmountCents(),
	}}, nil
}

func serve(lis net.Listener) error {
	engine, err := idem.New(memory.New()) // one process; store/postgres shares the handler's transaction
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))
	paymentsv1.RegisterPaymentServiceServer(srv, payments{})
	return srv.Serve(lis)
}

func main() {
	lis, err := net.Listen("tcp", "127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(serve(lis))
}
