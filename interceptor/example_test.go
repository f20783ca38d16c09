package interceptor_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store"
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
	e, err := idem.New(postgres.New(pool))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		interceptor.UnaryServerInterceptor(e),
	))
	_ = srv // register services, then srv.Serve(listener)
}

func ExampleWithTenant() {
	// Scope keys by the authenticated caller. A real server reads the
	// identity its authentication interceptor verified; this stand-in
	// trusts a header.
	tenant := func(ctx context.Context, header map[string][]string) (string, error) {
		if v := header["x-tenant-id"]; len(v) == 1 {
			return v[0], nil
		}
		return "", fmt.Errorf("no tenant")
	}
	_ = idem.WithTenant(tenant)
}

func ExampleWithClassifier() {
	// Record and replay PERMISSION_DENIED too, on top of the defaults.
	classify := func(s *spb.Status) bool {
		switch codes.Code(s.GetCode()) {
		case codes.PermissionDenied, // and the defaults:
			codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange,
			codes.AlreadyExists, codes.NotFound:
			return true
		}
		return false
	}
	_ = idem.WithClassifier(classify)
}

func ExampleKeyFromContext() {
	handler := func(ctx context.Context) {
		if key, ok := idem.KeyFromContext(ctx); ok {
			fmt.Println("handling", key)
		}
	}
	_ = handler
}

func ExampleValidateKey() {
	fmt.Println(idem.ValidateKey("2f1c6b0e-4a53-4f5e-9b7a-1d2c3e4f5a6b"))
	fmt.Println(idem.ValidateKey("has space"))
	// Output:
	// <nil>
	// must be visible ASCII (0x21-0x7E), got byte 0x20 at offset 3
}

func ExampleDeriveKey() {
	// The payment provider gets its own key for the "charge" step of the
	// Checkout request that tenant acme keyed "order-7f3a", the same on
	// every retry of that request and different from the children of
	// "order-7f3a" in any other tenant or method.
	parent := store.Key{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-7f3a"}
	fmt.Println(idem.DeriveKey(parent, "charge"))
	// Output: b710463d8d6589451baefeda0a9ef1576c53787e46f30a8113f2f406ab1d7774
}

func ExampleChildKey() {
	// A keyed handler that charges a provider over HTTP sends the child key
	// of its "charge" step, so that a retried request charges once.
	handler := func(ctx context.Context, charge *http.Request) (*http.Response, error) {
		key, ok := idem.ChildKey(ctx, "charge")
		if !ok {
			return nil, status.Error(codes.Internal, "not a keyed request")
		}
		charge.Header.Set("Idempotency-Key", key)
		return http.DefaultClient.Do(charge.WithContext(ctx))
	}
	_ = handler
}
