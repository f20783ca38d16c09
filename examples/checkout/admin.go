package main

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	providerv1 "github.com/idemkit/idem/examples/gen/provider/v1"
	"github.com/idemkit/idem/examples/internal/adminlisten"
	"github.com/idemkit/idem/store/postgres"
)

// serveAdmin serves idem's admin service over the checkout database on
// lis, behind the demo operator token, until stop is called. Its FinishKey
// runs abandoned checkouts through a finisher of this process, as a
// replica's finisher would: Checkout, with the provider's client, over the
// same database. That finisher never runs passes of its own (Run): the
// replicas' finishers do.
func (s *system) serveAdmin(lis net.Listener, token string) (stop func(), err error) {
	conn, err := grpc.NewClient(s.providerAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(checkoutsvc.ClientInterceptors()...))
	if err != nil {
		return nil, err
	}
	svc := checkoutsvc.New(s.checkoutDB, providerv1.NewProviderServiceClient(conn))
	finisher, err := checkoutsvc.NewFinisher(svc, nil, idem.FinisherConfig{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	srv, err := adminlisten.NewServer(adminlisten.Config{Store: postgres.New(s.checkoutDB), Token: token, Finisher: finisher})
	if err != nil {
		conn.Close()
		return nil, err
	}
	go func() { _ = srv.Serve(lis) }()
	return func() {
		srv.GracefulStop()
		conn.Close()
	}, nil
}

// adminFlags is where and behind which token the demo serves the admin
// service; lis is nil when it does not. After the stories, it keeps
// serving until until ends.
type adminFlags struct {
	lis   net.Listener
	token string
	until context.Context
}
