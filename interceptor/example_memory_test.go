package interceptor_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
)

// A unit test of a handler behind idem needs no database: the in-memory
// store keeps the same contract within one process. The interceptor is
// called directly here, as a test of a handler would.
func ExampleUnaryServerInterceptor_memoryStore() {
	e, err := idem.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	intercept := interceptor.UnaryServerInterceptor(e)
	charges := 0
	handler := func(ctx context.Context, req any) (any, error) {
		charges++
		return &testv1.MaybeResponse{Value: req.(*testv1.MaybeRequest).GetValue(), Execution: int64(charges)}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: testv1.TestService_Maybe_FullMethodName}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idem.KeyHeader, "order-1"))

	for range 3 { // a call and two retries with the same key
		resp, err := intercept(ctx, &testv1.MaybeRequest{Value: "10 EUR"}, info, handler)
		fmt.Println(resp.(*testv1.MaybeResponse).GetExecution(), err)
	}
	fmt.Println("charges:", charges)
	// Output:
	// 1 <nil>
	// 1 <nil>
	// 1 <nil>
	// charges: 1
}
