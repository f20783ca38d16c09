// Binary server is a buf user's service with idem: PlaceOrder, marked
// (idem.v1.method).key_required in shop.proto, served over gRPC, Connect and
// HTTP/JSON (grpc-gateway), with idem on each wire and one store, so a call
// over one wire and its retry over another are one operation. The handler
// writes its order on the transaction that holds the key. main_test.go tests
// the handler through idem's interceptor, and calls each wire.
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

	"connectrpc.com/connect"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemconnect"
	"github.com/idemkit/idem/interceptor/idemgateway"
	"github.com/idemkit/idem/store/postgres"

	shopv1 "example.com/shop/gen/shop/v1"
	"example.com/shop/gen/shop/v1/shopv1connect"
)

// schema is the shop's own table, beside idem's.
const schema = `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, sku text NOT NULL)`

// shop implements the grpc-go interface. protoc-gen-connect-go ran with
// the simple option, so the same implementation serves Connect.
type shop struct {
	shopv1.UnimplementedShopServiceServer
}

// PlaceOrder writes on the transaction that holds the key.
func (shop) PlaceOrder(ctx context.Context, req *shopv1.PlaceOrderRequest) (*shopv1.PlaceOrderResponse, error) {
	tx, ok := postgres.TxFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "PlaceOrder runs behind idem's interceptor")
	}
	var id string
	err := tx.QueryRow(ctx, `INSERT INTO orders (sku) VALUES ($1) RETURNING id::text`, req.GetSku()).Scan(&id)
	if err != nil {
		return nil, err
	}
	return &shopv1.PlaceOrderResponse{OrderId: "order-" + id}, nil
}

func main() {
	grpcAddr := flag.String("grpc-listen", "127.0.0.1:8081", "gRPC address")
	httpAddr := flag.String("http-listen", "127.0.0.1:8080", "Connect and HTTP/JSON address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *grpcAddr, *httpAddr); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, grpcAddr, httpAddr string) error {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // else the libpq defaults
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil { // idem's tables
		return err
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	glis, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return err
	}
	hlis, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return err
	}
	return serve(ctx, pool, glis, hlis)
}

// serve serves gRPC on glis, and Connect and HTTP/JSON on hlis, until ctx
// is done.
func serve(ctx context.Context, pool *pgxpool.Pool, glis, hlis net.Listener) error {
	engine, err := idem.New(postgres.New(pool))
	if err != nil {
		return err
	}
	svc := shop{}

	// gRPC.
	grpcServer := grpc.NewServer(
		grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(engine)),
		grpc.ChainStreamInterceptor(interceptor.StreamServerInterceptor()),
	)
	shopv1.RegisterShopServiceServer(grpcServer, svc)

	// HTTP/JSON: the gateway calls the gRPC server, whose interceptor does
	// the work.
	conn, err := grpc.NewClient(glis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	gateway := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	if err := shopv1.RegisterShopServiceHandler(ctx, gateway, conn); err != nil {
		return err
	}

	// Connect, beside the gateway's routes.
	mux := http.NewServeMux()
	mux.Handle(shopv1connect.NewShopServiceHandler(svc, connect.WithInterceptors(idemconnect.NewInterceptor(engine))))
	mux.Handle("/v1/", gateway)
	httpServer := &http.Server{Handler: mux}

	errc := make(chan error, 2)
	go func() { errc <- grpcServer.Serve(glis) }()
	go func() { errc <- httpServer.Serve(hlis) }()
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	grpcServer.Stop()
	if cerr := httpServer.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}
