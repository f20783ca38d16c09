package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	providerv1 "github.com/idemkit/idem/examples/gen/provider/v1"
	"github.com/idemkit/idem/examples/internal/adminlisten"
	"github.com/idemkit/idem/store/postgres"
)

// serveAdmin serves idem's admin service over the checkout database on
// lis, and its console on console unless it is nil, behind the demo
// operator token, until stop is called. Its FinishKey
// runs abandoned checkouts through a finisher of this process, as a
// replica's finisher would: Checkout, with the provider's client, over the
// same database. That finisher never runs passes of its own (Run): the
// replicas' finishers do.
func (s *system) serveAdmin(lis, console net.Listener, token string) (stop func(), err error) {
	conn, err := grpc.NewClient(s.providerAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(checkoutsvc.ClientInterceptors()...))
	if err != nil {
		return nil, err
	}
	svc := checkoutsvc.New(s.checkoutDB, providerv1.NewProviderServiceClient(conn))
	finisher, err := checkoutsvc.NewFinisher(svc, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	cfg := adminlisten.Config{Store: postgres.New(s.checkoutDB), Token: token, Finisher: finisher}
	srv, err := adminlisten.NewServer(cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	var cs *http.Server
	if console != nil {
		h, err := adminlisten.NewConsole(cfg)
		if err != nil {
			conn.Close()
			return nil, err
		}
		cs = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = cs.Serve(console) }()
	}
	go func() { _ = srv.Serve(lis) }()
	return func() {
		if cs != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = cs.Shutdown(ctx)
			cancel()
		}
		srv.GracefulStop()
		conn.Close()
	}, nil
}

// adminFlags is where and behind which token the demo serves the admin
// service, and its console; lis is nil when it does not, console when it
// serves no console. After the stories, it keeps serving until until ends.
type adminFlags struct {
	lis     net.Listener
	console net.Listener
	token   string
	until   context.Context
}

// abandonedKey is the key of the checkout the demo leaves abandoned for an
// operator, after the stories, when it serves the admin service.
const abandonedKey = "order-1"

// leaveAbandoned sends the checkout abandonedKey to a replica that dies
// once its charge step is saved, while no replica runs a finisher, and
// returns once its lease has run out: an abandoned checkout, charged and
// neither confirmed nor answered, that only an operator's FinishKey
// finishes.
func (s *system) leaveAbandoned(ctx context.Context) error {
	a, err := s.startReplica(ctx, "D", replicaConfig{crashAt: runnerCall + ":" + checkoutsvc.StepCharge, grace: time.Hour})
	if err != nil {
		return err
	}
	defer a.stop()
	if _, _, err := checkout(ctx, a, abandonedKey); err == nil {
		return errors.New("the checkout on the dying replica succeeded")
	}
	if err := a.wait(ctx); err == nil {
		return errors.New("replica D did not die")
	}
	// The database's clock decides when the lease has run out.
	for {
		var seconds float64
		err := s.checkoutDB.QueryRow(ctx,
			`SELECT greatest(extract(epoch FROM locked_until - now()), 0)::float8 FROM idempotency_keys WHERE key = $1 AND status = 'in_progress'`,
			abandonedKey).Scan(&seconds)
		if err != nil {
			return fmt.Errorf("the abandoned checkout's lease: %w", err)
		}
		if seconds == 0 {
			return nil
		}
		select {
		case <-time.After(time.Duration(seconds * float64(time.Second))):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
