package readme

import (
	"context"
	"log/slog"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

// The snippets of docs/observability.md.

func observed(store *postgres.Store, meterProvider metric.MeterProvider, tracerProvider trace.TracerProvider, logger *slog.Logger) (*idem.Engine, error) {
	return idem.New(store,
		idem.WithMeterProvider(meterProvider), // also a client option
		idem.WithTracerProvider(tracerProvider),
		idem.WithLogger(logger))
}

func logged(logger logging.Logger, engine *idem.Engine) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(
		logging.UnaryServerInterceptor(logger), // first: it sees idem's fields
		recovery.UnaryServerInterceptor(),
		interceptor.UnaryServerInterceptor(engine),
	)
}

func hooked(replayedPayments metric.Int64Counter) idem.Option {
	return idem.WithReportHook(func(ctx context.Context, r idem.Report) {
		if r.Replayed {
			replayedPayments.Add(ctx, 1) // the customer retried; nothing was charged again
		}
	})
}
