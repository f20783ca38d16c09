package main

import (
	"context"
	"net"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	inventoryv1 "github.com/idemkit/idem/examples/gen/inventory/v1"
	ordersv1 "github.com/idemkit/idem/examples/gen/orders/v1"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/orders/inventorysvc"
	"github.com/idemkit/idem/examples/orders/ordersvc"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres"
)

// system is the three services, each a gRPC server on a loopback port with
// a database of its own, and a client of OrderService.
type system struct {
	ordersDB, paymentsDB, inventoryDB *pgxpool.Pool

	orders    ordersv1.OrderServiceClient
	lossy     *faults     // loses responses on the client's side
	crash     *faults     // fails PlaceOrder after its handler ran, before commit
	orderLog  *attemptLog // PlaceOrder attempts that reached the orders server
	paymLog   *attemptLog // CreatePayment attempts that reached the payments server
	inventory *inventorysvc.Stub
	stop      []func()
}

// startSystem migrates the three databases and starts the services.
func startSystem(ctx context.Context, ordersDB, paymentsDB, inventoryDB *pgxpool.Pool) (*system, error) {
	s := &system{
		ordersDB: ordersDB, paymentsDB: paymentsDB, inventoryDB: inventoryDB,
		lossy: &faults{}, crash: &faults{},
		orderLog: &attemptLog{}, paymLog: &attemptLog{},
		inventory: &inventorysvc.Stub{},
	}
	if err := paymentsvc.Migrate(ctx, paymentsDB); err != nil {
		return nil, err
	}
	if err := inventorysvc.Migrate(ctx, inventoryDB); err != nil {
		return nil, err
	}
	if err := ordersvc.Migrate(ctx, ordersDB); err != nil {
		return nil, err
	}

	// The payments example's service, behind a recorder of its attempts.
	paymentsEngine, err := idem.New(postgres.New(paymentsDB), idem.WithTenant(paymentsvc.TenantOf))
	if err != nil {
		return nil, err
	}
	payments := grpc.NewServer(grpc.ChainUnaryInterceptor(
		s.paymLog.record,
		interceptor.UnaryServerInterceptor(paymentsEngine),
	))
	paymentsv1.RegisterPaymentServiceServer(payments, paymentsvc.New(paymentsDB))
	paymentsAddr, err := s.serve(payments)
	if err != nil {
		return nil, err
	}
	inventory, err := inventorysvc.NewServer(inventoryDB, s.inventory)
	if err != nil {
		return nil, err
	}
	inventoryAddr, err := s.serve(inventory)
	if err != nil {
		return nil, err
	}
	paymentsConn, err := s.dial(paymentsAddr, ordersvc.ClientInterceptors()...)
	if err != nil {
		return nil, err
	}
	inventoryConn, err := s.dial(inventoryAddr, ordersvc.ClientInterceptors()...)
	if err != nil {
		return nil, err
	}
	svc := ordersvc.New(ordersDB, paymentsv1.NewPaymentServiceClient(paymentsConn), inventoryv1.NewInventoryServiceClient(inventoryConn))
	ics, err := ordersvc.ServerInterceptors(svc)
	if err != nil {
		return nil, err
	}
	chain := append([]grpc.UnaryServerInterceptor{s.orderLog.record}, ics...)
	orders := grpc.NewServer(grpc.ChainUnaryInterceptor(append(chain, s.crash.afterHandler)...))
	ordersv1.RegisterOrderServiceServer(orders, svc)
	ordersAddr, err := s.serve(orders)
	if err != nil {
		return nil, err
	}
	// The client: idem attaches the key, the retry interceptor retries, and
	// below both the network may lose the response.
	ordersConn, err := s.dial(ordersAddr, append(ordersvc.ClientInterceptors(), s.lossy.loseResponse)...)
	if err != nil {
		return nil, err
	}
	s.orders = ordersv1.NewOrderServiceClient(ordersConn)
	return s, nil
}

func (s *system) serve(srv *grpc.Server) (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = srv.Serve(lis) }()
	s.stop = append(s.stop, srv.Stop)
	return lis.Addr().String(), nil
}

func (s *system) dial(addr string, chain ...grpc.UnaryClientInterceptor) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(chain...))
	if err != nil {
		return nil, err
	}
	s.stop = append(s.stop, func() { _ = conn.Close() })
	return conn, nil
}

func (s *system) close() {
	for _, f := range slices.Backward(s.stop) {
		f()
	}
}

// faults injects a number of failures.
type faults struct {
	mu sync.Mutex
	n  int
}

func (f *faults) arm(n int) {
	f.mu.Lock()
	f.n = n
	f.mu.Unlock()
}

func (f *faults) take() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return false
	}
	f.n--
	return true
}

// loseResponse is a client interceptor: the call reaches the server and
// commits, and the client sees UNAVAILABLE instead of the response.
func (f *faults) loseResponse(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && f.take() {
		return status.Error(codes.Unavailable, "response lost in transit")
	}
	return err
}

// afterHandler is a server interceptor inside idem: the handler runs, with
// its outbound calls, and then the server fails before commit.
func (f *faults) afterHandler(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err == nil && f.take() {
		return nil, status.Error(codes.Unavailable, "server crashed before commit")
	}
	return resp, err
}

// attempt is one call as a server saw it, before idem.
type attempt struct {
	key  string
	code codes.Code
}

// attemptLog is a server interceptor, first in the chain, that records the
// key and outcome of every call.
type attemptLog struct {
	mu       sync.Mutex
	attempts []attempt
}

func (l *attemptLog) record(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var key string
	if v := metadata.ValueFromIncomingContext(ctx, idem.KeyHeader); len(v) == 1 {
		key = v[0]
	}
	resp, err := handler(ctx, req)
	l.mu.Lock()
	l.attempts = append(l.attempts, attempt{key: key, code: status.Code(err)})
	l.mu.Unlock()
	return resp, err
}

func (l *attemptLog) all() []attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.attempts)
}
