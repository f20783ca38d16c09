package readme

import (
	"context"
	"log/slog"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

// The snippets of the README's section "Observability".

func observed(store *postgres.Store, meterProvider metric.MeterProvider, tracerProvider trace.TracerProvider, logger *slog.Logger) grpc.UnaryServerInterceptor {
	return interceptor.UnaryServerInterceptor(store,
		interceptor.WithMeterProvider(meterProvider), // also a client option
		interceptor.WithTracerProvider(tracerProvider),
		interceptor.WithLogger(logger))
}

func logged(logger logging.Logger, store *postgres.Store) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(
		logging.UnaryServerInterceptor(logger), // first: it sees idem's fields
		recovery.UnaryServerInterceptor(),
		interceptor.UnaryServerInterceptor(store),
	)
}

func hooked(replayedPayments metric.Int64Counter) interceptor.ServerOption {
	return interceptor.WithOutcomeHook(func(ctx context.Context, o interceptor.Outcome) {
		if o.Replayed {
			replayedPayments.Add(ctx, 1) // the customer retried; nothing was charged again
		}
	})
}
