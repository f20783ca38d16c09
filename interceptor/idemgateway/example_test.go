package idemgateway_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/textproto"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem/interceptor/idemgateway"
	gatewaytestv1 "github.com/idemkit/idem/interceptor/idemgateway/internal/gen/idem/gatewaytest/v1"
)

// A gateway in front of a gRPC server that runs idem's interceptor.
func Example() {
	ctx := context.Background()
	// The gRPC server, with interceptor.UnaryServerInterceptor in its chain.
	conn, err := grpc.NewClient("127.0.0.1:50051", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	// Your service's generated Register…Handler, which calls the gRPC server
	// through conn.
	if err := gatewaytestv1.RegisterTransferServiceHandler(ctx, mux, conn); err != nil {
		log.Fatal(err)
	}
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

// The key reaches the gRPC call parsed, whether the client quoted it or
// not; a malformed one is refused before the call.
func ExampleKeyMiddleware() {
	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	// A route that shows what the call gets; generated code registers the
	// service's routes.
	_ = mux.HandlePath(http.MethodPost, "/v1/payments", func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		fmt.Fprintf(w, "key %s\n", r.Header.Get("Idempotency-Key"))
	})
	for _, key := range []string{`"order-1"`, `order-1`, `"order-1`} {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", nil)
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
	// Output:
	// 200 text/plain; charset=utf-8 key order-1
	//
	// 200 text/plain; charset=utf-8 key order-1
	//
	// 400 application/problem+json {"type":"https://pkg.go.dev/github.com/idemkit/idem#ReasonKeyInvalid","title":"Idempotency-Key is malformed","status":400,"detail":"The Idempotency-Key header is malformed: a quoted key must be one Structured Field String (RFC 8941): visible ASCII between double quotes, escaping only \\\" and \\\\, with nothing after the closing quote (invalid string format: character 8).","reason":"IDEMPOTENCY_KEY_INVALID"}
}

// Headers of your own next to idem's: the tenant from X-Tenant-Id, and the
// rest as grpc-gateway's default does.
func ExampleIncomingHeaderMatcher() {
	tenant := func(key string) (string, bool) {
		if textproto.CanonicalMIMEHeaderKey(key) == "X-Tenant-Id" {
			return "x-tenant-id", true
		}
		return runtime.DefaultHeaderMatcher(key)
	}
	opts := append(idemgateway.ServeMuxOptions(),
		runtime.WithIncomingHeaderMatcher(idemgateway.IncomingHeaderMatcher(tenant)))
	_ = runtime.NewServeMux(opts...)

	match := idemgateway.IncomingHeaderMatcher(tenant)
	for _, h := range []string{"Idempotency-Key", "X-Tenant-Id", "Accept", "X-Other"} {
		name, ok := match(h)
		fmt.Printf("%s: %q %v\n", h, name, ok)
	}
	// Output:
	// Idempotency-Key: "idempotency-key" true
	// X-Tenant-Id: "x-tenant-id" true
	// Accept: "grpcgateway-Accept" true
	// X-Other: "" false
}
