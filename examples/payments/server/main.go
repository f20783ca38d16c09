// Binary server demonstrates idem in a standalone gRPC server: PaymentService
// with the idem interceptor on PostgreSQL, plus gRPC health checking and
// server reflection, and optionally HTTP/JSON through grpc-gateway.
//
//	go run ./examples/payments/server -listen 127.0.0.1:50051 -database-url postgres:///root
//
// With -http-listen ADDR it also serves PaymentService as HTTP/JSON on ADDR
// (POST /v1/payments, GET /v1/payments/{id}): the gateway calls the gRPC
// server, so the same keys, rows and answers serve both, and clients send
// their key in the Idempotency-Key header (see package idemgateway).
//
// Without -database-url it uses $DATABASE_URL, and without that the libpq
// defaults (PGHOST, PGPORT, PGUSER, PGDATABASE, the local socket): then the
// database is $PGDATABASE, or else the one named like the OS user. It
// creates its tables (payments, and idem's idempotency_keys and
// processed_messages) in that database at start, and logs which database it
// is; give it a database of its own. The tenant comes from the x-tenant-id
// header (X-Tenant-Id over HTTP), a stand-in for real authentication. It
// also sweeps expired keys.
//
// With -shard-database-url given twice or more, one connection string each,
// tenants are spread over those databases, the shards, by a stable hash of
// the tenant (paymentsvc.ShardOf), in place of -database-url: a tenant's
// idempotency keys and payments live on its shard, and each CreatePayment
// claims its key and inserts the payment in one transaction there. It
// creates the tables in every shard and sweeps each (see docs/shards.md).
//
// With -http-listen ADDR it also serves PaymentService as HTTP/JSON through
// grpc-gateway. With -metrics-listen ADDR it serves idem's metrics (and the
// sweeper's) in the Prometheus text format at http://ADDR/metrics, through
// the OpenTelemetry SDK and its Prometheus exporter: after a retry,
// idem_server_requests_total{idem_result="replayed",...} counts it.
//
// With -admin-listen ADDR it serves idem's admin service
// (idem.admin.v1.AdminService: list, read, forget and settle keys) on ADDR,
// a listener of its own, with gRPC health checking and server reflection
// so that grpcurl works. Its demo authorizer admits the callers that send
// the operator token of -admin-token (default $IDEM_ADMIN_TOKEN) as
// "authorization: Bearer TOKEN"; the server refuses to start without one.
// In production, use mTLS or your identity provider instead. The admin
// calls are counted in the metrics (rpc_server_call_duration_seconds,
// through otelgrpc) and traced with the global tracer provider. With
// -console-listen ADDR it serves the admin service's console
// (admin.NewConsole) at http://ADDR/console/, behind the same token, which
// a browser sends as the password of HTTP basic authentication (any user
// name). With -mode atomic, optimistic or auto it claims CreatePayment's
// keys in that mode instead of its proto option's (docs/modes.md).
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
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/internal/adminlisten"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/store/postgres"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:50051", "address to serve gRPC on")
	httpListen := flag.String("http-listen", "", "address to serve HTTP/JSON on, through grpc-gateway (default: none)")
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL connection string (default $DATABASE_URL, else the libpq defaults)")
	metricsListen := flag.String("metrics-listen", "", "address to serve Prometheus metrics on, at /metrics (default: none)")
	adminListen := flag.String("admin-listen", "", "address to serve idem's admin service on, for operators (default: none)")
	consoleListen := flag.String("console-listen", "", "address to serve the admin service's console on, at /console/, for operators' browsers (default: none)")
	mode := flag.String("mode", "", "the idem mode CreatePayment's keys are claimed in: atomic, optimistic or auto (default: its proto option's, atomic; docs/modes.md)")
	adminToken := flag.String("admin-token", os.Getenv(adminlisten.TokenEnv), "operator token the admin service requires as \"authorization: Bearer TOKEN\", a demo authorizer (default $"+adminlisten.TokenEnv+"; required with -admin-listen and -console-listen)")
	var shards []string
	flag.Func("shard-database-url", "PostgreSQL connection string of a shard; repeat it for each shard, in a fixed order (default: one database, -database-url)", func(url string) error {
		shards = append(shards, url)
		return nil
	})
	flag.Parse()
	if len(shards) == 0 {
		shards = []string{*dbURL}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	var httpLis, metricsLis net.Listener
	if *httpListen != "" {
		if httpLis, err = net.Listen("tcp", *httpListen); err != nil {
			log.Fatal(err)
		}
	}
	if *metricsListen != "" {
		if metricsLis, err = net.Listen("tcp", *metricsListen); err != nil {
			log.Fatal(err)
		}
	}
	var adm *adminConfig
	if *adminListen != "" || *consoleListen != "" {
		if *adminToken == "" {
			log.Fatalf("-admin-listen, -console-listen: %v", adminlisten.ErrNoToken)
		}
		adm = &adminConfig{token: *adminToken}
		for _, l := range []struct {
			addr string
			lis  *net.Listener
		}{{*adminListen, &adm.lis}, {*consoleListen, &adm.console}} {
			if l.addr == "" {
				continue
			}
			if *l.lis, err = net.Listen("tcp", l.addr); err != nil {
				log.Fatal(err)
			}
		}
	}
	switch idem.Mode(*mode) {
	case "", idem.ModeAtomic, idem.ModeOptimistic, idem.ModeAuto:
	default:
		log.Fatalf("-mode %q: want atomic, optimistic or auto (CreatePayment writes in the claim's transaction, which leased mode does not hand it)", *mode)
	}
	if err := run(ctx, lis, httpLis, metricsLis, adm, idem.Mode(*mode), shards...); err != nil {
		log.Fatal(err)
	}
}

// adminConfig is where and behind which operator token the admin service
// and its console are served: on lis and console, each unless nil.
type adminConfig struct {
	lis     net.Listener
	console net.Listener
	token   string
}

// run serves PaymentService as gRPC on lis and, unless httpLis is nil, as
// HTTP/JSON on httpLis, the metrics on metricsLis unless it is nil, and the
// admin service as adm says unless adm is nil, until ctx ends; then it
// stops gracefully. It claims CreatePayment's keys in mode, or in its proto
// option's when mode is "". dbURLs are the connection strings of the
// database, or of each shard when there are several.
func run(ctx context.Context, lis, httpLis, metricsLis net.Listener, adm *adminConfig, mode idem.Mode, dbURLs ...string) error {
	defer lis.Close()
	if adm != nil {
		for _, l := range []net.Listener{adm.lis, adm.console} {
			if l != nil {
				defer l.Close()
			}
		}
		if adm.token == "" {
			return adminlisten.ErrNoToken
		}
	}
	if httpLis != nil {
		defer httpLis.Close()
	}
	var mp metric.MeterProvider // nil: the global provider, which records nothing here
	if metricsLis != nil {
		var stop func()
		var err error
		if mp, stop, err = serveMetrics(metricsLis); err != nil {
			return err
		}
		defer stop()
	}
	if len(dbURLs) == 0 {
		dbURLs = []string{""} // the libpq defaults
	}
	pools := make([]*pgxpool.Pool, len(dbURLs))
	for i, url := range dbURLs {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return err
		}
		defer pool.Close()
		cc := pool.Config().ConnConfig
		if len(dbURLs) == 1 {
			log.Printf("payments server: creating its tables in database %q on %s (set -database-url to choose another)", cc.Database, cc.Host)
		} else {
			log.Printf("payments server: creating its tables in shard %d, database %q on %s", i, cc.Database, cc.Host)
		}
		if err := paymentsvc.Migrate(ctx, pool); err != nil {
			return err
		}
		pools[i] = pool
	}
	var (
		srv *grpc.Server
		st  *postgres.Store
		err error
	)
	opts := []idem.Option{idem.WithMeterProvider(mp)}
	if mode != "" {
		opts = append(opts, idem.WithMethodPolicy(paymentsv1.PaymentService_CreatePayment_FullMethodName, idem.MethodPolicy{KeyRequired: true, Mode: mode}))
	}
	if len(pools) == 1 {
		// Say now, not on the first call, if idem cannot serve.
		st = postgres.New(pools[0])
		if err := st.Check(ctx); err != nil {
			return err
		}
		srv, err = paymentsvc.NewServer(pools[0], opts...)
	} else {
		route := func(tenant string) int { return paymentsvc.ShardOf(tenant, len(pools)) }
		st = postgres.NewSharded(pools, route)
		if err := st.Check(ctx); err != nil {
			return err
		}
		srv, err = paymentsvc.NewShardedServer(pools, opts...)
	}
	if err != nil {
		return err
	}
	// Each shard's expired keys are swept on that shard.
	for _, pool := range pools {
		go func() { _ = postgres.NewSweeper(pool, postgres.WithMeterProvider(mp)).Run(ctx) }()
	}

	var gateway *http.Server
	gatewayErr := make(chan error, 1)
	if httpLis != nil {
		// The gateway is a client of the gRPC server, so idem's interceptor
		// runs for HTTP requests as for gRPC ones.
		conn, err := grpc.NewClient(dialTarget(lis.Addr()), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		mux, err := paymentsvc.NewGateway(ctx, conn)
		if err != nil {
			return err
		}
		gateway = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := gateway.Serve(httpLis); !errors.Is(err, http.ErrServerClosed) {
				gatewayErr <- err
				srv.Stop()
			}
		}()
		log.Printf("payments gateway serving HTTP/JSON on %s", httpLis.Addr())
	}

	if adm != nil && adm.lis != nil {
		// The operators' listener: the admin service over the same store,
		// its calls in the same metrics as idem's.
		as, err := adminlisten.NewServer(adminlisten.Config{Store: st, Token: adm.token, MeterProvider: mp})
		if err != nil {
			return err
		}
		go func() { _ = as.Serve(adm.lis) }()
		defer as.GracefulStop()
		log.Printf("payments server: admin service on %s (demo operator token; use mTLS or your identity provider in production)", adm.lis.Addr())
	}
	if adm != nil && adm.console != nil {
		// The operators' browsers: the admin service's console, next to it.
		h, err := adminlisten.NewConsole(adminlisten.Config{Store: st, Token: adm.token})
		if err != nil {
			return err
		}
		cs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = cs.Serve(adm.console) }()
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = cs.Shutdown(sctx)
		}()
		log.Printf("payments server: admin console at http://%s%s (demo operator token as the basic authentication password)", adm.console.Addr(), adminlisten.ConsolePath)
	}

	served := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-served:
		}
		if gateway != nil {
			// First the HTTP requests, which wait for their gRPC calls.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = gateway.Shutdown(sctx)
			cancel()
		}
		srv.GracefulStop()
	}()
	log.Printf("payments server listening on %s", lis.Addr())
	err = srv.Serve(lis)
	close(served)
	select {
	case gerr := <-gatewayErr:
		return gerr
	default:
		return err
	}
}

// dialTarget returns the address at which to call a server listening on
// addr: localhost for a listener on every interface (0.0.0.0 or ::).
func dialTarget(addr net.Addr) string {
	a, ok := addr.(*net.TCPAddr)
	if !ok || (a.IP != nil && !a.IP.IsUnspecified()) {
		return addr.String()
	}
	return net.JoinHostPort("localhost", strconv.Itoa(a.Port))
}

// serveMetrics serves, on lis at /metrics, the metrics of the meter provider
// it returns, in the Prometheus text format, until stop is called.
func serveMetrics(lis net.Listener) (mp metric.MeterProvider, stop func(), err error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg),
		// idem.server.requests becomes idem_server_requests_total, and the
		// attribute idem.result the label idem_result.
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
