package interceptor_test

import (
	"testing"

	"github.com/idemkit/idem/internal/idemtest/grpctest"
	"github.com/idemkit/idem/transport/transporttest"
)

// TestConformance runs the transport conformance suite on grpc-go with
// idem's interceptors.
func TestConformance(t *testing.T) {
	transporttest.Run(t, grpctest.Harness{})
}
