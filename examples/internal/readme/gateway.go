package readme

import (
	"context"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/interceptor/idemgateway"
)

// The snippet of docs/http.md.

func gateway(ctx context.Context, conn *grpc.ClientConn) (http.Handler, error) {
	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	// The generated handler calls the gRPC server, whose interceptor does the work.
	err := paymentsv1.RegisterPaymentServiceHandler(ctx, mux, conn)
	return mux, err
}
