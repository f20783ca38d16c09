package interceptor_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

func ExampleUnaryServerInterceptor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		interceptor.UnaryServerInterceptor(postgres.New(pool)),
	))
	_ = srv // register services, then srv.Serve(listener)
}

func ExampleWithTenant() {
	// Scope keys by the authenticated caller. A real server reads the
	// identity its authentication interceptor verified; this stand-in
	// trusts a header.
	tenant := interceptor.TenantFunc(func(ctx context.Context) (string, error) {
		if v := metadata.ValueFromIncomingContext(ctx, "x-tenant-id"); len(v) == 1 {
			return v[0], nil
		}
		return "", fmt.Errorf("no tenant")
	})
	_ = interceptor.WithTenant(tenant)
}

func ExampleWithClassifier() {
	// Record and replay PERMISSION_DENIED too, on top of the defaults.
	classify := interceptor.ClassifierFunc(func(s *status.Status) bool {
		return s.Code() == codes.PermissionDenied || interceptor.DefaultClassifier.Deterministic(s)
	})
	_ = interceptor.WithClassifier(classify)
}

func ExampleKeyFromContext() {
	handler := func(ctx context.Context) {
		if key, ok := interceptor.KeyFromContext(ctx); ok {
			fmt.Println("handling", key)
		}
	}
	_ = handler
}

func ExampleValidateKey() {
	fmt.Println(interceptor.ValidateKey("2f1c6b0e-4a53-4f5e-9b7a-1d2c3e4f5a6b"))
	fmt.Println(interceptor.ValidateKey("has space"))
	// Output:
	// <nil>
	// must be visible ASCII (0x21-0x7E), got byte 0x20 at offset 3
}

func ExampleDeriveKey() {
	// The payment provider gets its own key for the "charge" step of the
	// request keyed "order-7f3a", the same on every retry of that request.
	fmt.Println(interceptor.DeriveKey("order-7f3a", "charge"))
	// Output: 6f461e2dc5ef03a5a0bad84fbaa0c8a093755775e7add23d5527b4ce2eb91dec
}
