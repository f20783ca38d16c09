// Binary server demonstrates idem in a standalone gRPC server: PaymentService
// with the idem interceptor on PostgreSQL, plus gRPC health checking and
// server reflection.
//
//	go run ./examples/payments/server -listen 127.0.0.1:50051 -database-url postgres:///root
//
// Without -database-url it uses $DATABASE_URL, and without that the libpq
// defaults (PGHOST, PGPORT, PGUSER, PGDATABASE, the local socket): then the
// database is $PGDATABASE, or else the one named like the OS user. It
// creates its tables (payments, and idem's idempotency_keys and
// processed_messages) in that database at start, and logs which database it
// is; give it a database of its own. The tenant comes from the x-tenant-id
// header, a stand-in for real authentication. It also sweeps expired keys.
//
// With -metrics-listen ADDR it serves idem's metrics (and the sweeper's) in
// the Prometheus text format at http://ADDR/metrics, through the
// OpenTelemetry SDK and its Prometheus exporter: after a retry,
// idem_server_requests_total{idem_outcome="replayed",...} counts it.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:50051", "address to serve gRPC on")
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL connection string (default $DATABASE_URL, else the libpq defaults)")
	metricsListen := flag.String("metrics-listen", "", "address to serve Prometheus metrics on, at /metrics (default: none)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	var metricsLis net.Listener
	if *metricsListen != "" {
		if metricsLis, err = net.Listen("tcp", *metricsListen); err != nil {
			log.Fatal(err)
		}
	}
	if err := run(ctx, lis, metricsLis, *dbURL); err != nil {
		log.Fatal(err)
	}
}

// run serves PaymentService on lis until ctx ends, then stops gracefully,
// and, when metricsLis is not nil, the metrics on it.
func run(ctx context.Context, lis, metricsLis net.Listener, dbURL string) error {
	defer lis.Close()
	var mp metric.MeterProvider // nil: the global provider, which records nothing here
	if metricsLis != nil {
		var stop func()
		var err error
		if mp, stop, err = serveMetrics(metricsLis); err != nil {
			return err
		}
		defer stop()
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cc := pool.Config().ConnConfig
	log.Printf("payments server: creating its tables in database %q on %s (set -database-url to choose another)", cc.Database, cc.Host)
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		return err
	}
	// Say now, not on the first call, if idem cannot serve.
	if err := postgres.New(pool).Check(ctx); err != nil {
		return err
	}
	srv := paymentsvc.NewServer(pool, interceptor.WithMeterProvider(mp))
	go func() { _ = postgres.NewSweeper(pool, postgres.WithSweepMeterProvider(mp)).Run(ctx) }()
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Printf("payments server listening on %s", lis.Addr())
	return srv.Serve(lis)
}

// serveMetrics serves, on lis at /metrics, the metrics of the meter provider
// it returns, in the Prometheus text format, until stop is called.
func serveMetrics(lis net.Listener) (mp metric.MeterProvider, stop func(), err error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg),
		// idem.server.requests becomes idem_server_requests_total, and the
		// attribute idem.outcome the label idem_outcome.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, nil, err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			log.Printf("metrics server: %v", err)
		}
	}()
	log.Printf("payments server: metrics at http://%s/metrics", lis.Addr())
	return provider, func() {
		_ = hs.Close()
		_ = provider.Shutdown(context.Background())
	}, nil
}
