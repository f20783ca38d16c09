//go:build unix

// Binary crashserver is the payments server with one fault built in: a
// CreatePayment call whose metadata carries x-crash-after-commit kills the
// process with SIGKILL after idem has committed the payment together with
// its recorded response, and before gRPC writes the response. Every other
// call is served as by examples/payments/server. It exists for the tests in
// package chaos, which use it to lose a response whose effect committed.
//
//	crashserver -listen 127.0.0.1:50051 -database-url postgres:///root
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

// CrashHeader is the metadata key that asks for the crash. Headers are not
// part of the request fingerprint, so a retry without it replays the
// committed call.
const CrashHeader = "x-crash-after-commit"

func main() {
	listen := flag.String("listen", "127.0.0.1:50051", "address to serve gRPC on")
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL connection string")
	mode := flag.String("mode", "", "the idem mode CreatePayment's keys are claimed in (default: its proto option's)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// The chain of paymentsvc.NewServer, with the crash outside it: it sees
	// what idem returned, after idem's COMMIT.
	opts := []idem.Option{idem.WithTenant(paymentsvc.TenantOf)}
	if *mode != "" {
		opts = append(opts, idem.WithMethodPolicy(paymentsv1.PaymentService_CreatePayment_FullMethodName, idem.MethodPolicy{KeyRequired: true, Mode: idem.Mode(*mode)}))
	}
	engine, err := idem.New(postgres.New(pool), opts...)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		crashAfterCommit,
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Internal, "internal error")
		})),
		interceptor.UnaryServerInterceptor(engine),
	))
	paymentsv1.RegisterPaymentServiceServer(srv, paymentsvc.New(pool))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Printf("crashserver listening on %s", lis.Addr())
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
}

// crashAfterCommit kills the process once a marked call succeeded: the
// payment and its recorded response are committed, and the client never
// hears of it.
func crashAfterCommit(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err == nil && len(metadata.ValueFromIncomingContext(ctx, CrashHeader)) > 0 {
		log.Printf("crashserver: %s committed; killing the process before the response is written", info.FullMethod)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; the process ends here
	}
	return resp, err
}
