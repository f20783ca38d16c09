package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
)

// A connect-go handler behind idem, and a client that retries one logical
// call with its key: the handler runs once, and the retry gets the recorded
// answer, marked as a replay. (On store/memory; use store/postgres in
// production, and write on postgres.TxFromContext in the handler.)
func Example() {
	payments := 0
	create := func(ctx context.Context, req *connect.Request[testv1.CreatePaymentRequest]) (*connect.Response[testv1.CreatePaymentResponse], error) {
		payments++
		return connect.NewResponse(&testv1.CreatePaymentResponse{Payment: &testv1.Payment{
			Id:          fmt.Sprintf("pay_%d", payments),
			AmountCents: req.Msg.GetAmountCents(),
		}}), nil
	}
	procedure := testv1.PaymentService_CreatePayment_FullMethodName
	engine, err := idem.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, create,
		connect.WithInterceptors(idemconnect.NewInterceptor(engine))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := connect.NewClient[testv1.CreatePaymentRequest, testv1.CreatePaymentResponse](
		srv.Client(), srv.URL+procedure,
		connect.WithInterceptors(idemconnect.NewClientInterceptor()))
	// The key of one logical call, kept across a restart of the caller:
	// both calls carry Idempotency-Key: "order-1".
	ctx := idem.ContextWithKey(context.Background(), "order-1")
	for range 2 {
		resp, err := client.CallUnary(ctx, connect.NewRequest(&testv1.CreatePaymentRequest{AmountCents: 1250}))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Msg.GetPayment().GetId(), "replayed:", resp.Header().Get(idem.HTTPReplayedHeader) == "true")
	}
	fmt.Println("payments:", payments)
	// Output:
	// pay_1 replayed: false
	// pay_1 replayed: true
	// payments: 1
}

func ExampleNewInterceptor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	// The tenant resolver gets the request headers as gRPC metadata would
	// carry them (lower-case names), so that one function serves grpc-go
	// and connect-go. A real server reads the identity its authentication
	// verified; this stand-in trusts a header.
	tenantOf := func(ctx context.Context, header map[string][]string) (string, error) {
		return strings.Join(header["x-tenant-id"], ""), nil
	}
	// Authentication runs first, so that the tenant comes from the caller.
	var authn connect.Interceptor = connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc { return next })

	engine, err := idem.New(postgres.New(pool), idem.WithTenant(tenantOf))
	if err != nil {
		log.Fatal(err)
	}
	interceptors := connect.WithInterceptors(
		authn,
		idemconnect.NewInterceptor(engine), // the engine of idem.New, as above
	)
	// A HandlerOption of your generated handler:
	// mux.Handle(paymentsv1connect.NewPaymentServiceHandler(svc, interceptors))
	_ = interceptors
}

func ExampleNewClientInterceptor() {
	// Before the retry interceptor, so that every attempt of a logical
	// call carries the key it chose. A ClientOption of your generated
	// client:
	// client := paymentsv1connect.NewPaymentServiceClient(httpClient, baseURL, interceptors)
	interceptors := connect.WithInterceptors(
		idemconnect.NewClientInterceptor(),
		idemconnect.NewRetryInterceptor(),
	)
	_ = interceptors
}

// A call whose first attempt meets a store that failed (UNAVAILABLE, which
// releases the key) is sent again with its key and pays once.
func ExampleNewRetryInterceptor() {
	var (
		mu         sync.Mutex
		executions int
		keys       = map[string]bool{}
	)
	create := func(ctx context.Context, req *connect.Request[testv1.CreatePaymentRequest]) (*connect.Response[testv1.CreatePaymentResponse], error) {
		mu.Lock()
		defer mu.Unlock()
		executions++
		key, _ := idem.KeyFromContext(ctx)
		keys[key] = true
		if executions == 1 {
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("ledger unreachable"))
		}
		return connect.NewResponse(&testv1.CreatePaymentResponse{Payment: &testv1.Payment{Id: "pay_1"}}), nil
	}
	procedure := testv1.PaymentService_CreatePayment_FullMethodName
	engine, err := idem.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, create,
		connect.WithInterceptors(idemconnect.NewInterceptor(engine))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := connect.NewClient[testv1.CreatePaymentRequest, testv1.CreatePaymentResponse](
		srv.Client(), srv.URL+procedure,
		connect.WithInterceptors(
			idemconnect.NewClientInterceptor(), // one key per logical call
			idemconnect.NewRetryInterceptor(
				idemconnect.WithMaxAttempts(3), // default 5
			),
		))
	resp, err := client.CallUnary(context.Background(), connect.NewRequest(&testv1.CreatePaymentRequest{AmountCents: 1250}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Msg.GetPayment().GetId())
	fmt.Println("executions:", executions, "keys:", len(keys))
	// Output:
	// pay_1
	// executions: 2 keys: 1
}

// RetryDelay reads the delay a server's answer asks a retry to wait, for a
// loop of your own.
func ExampleRetryDelay() {
	ce := connect.NewError(connect.CodeAborted, errors.New("idem: a request with this idempotency key is still in flight; retry later"))
	detail, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	if err != nil {
		log.Fatal(err)
	}
	ce.AddDetail(detail)
	if d, ok := idemconnect.RetryDelay(ce); ok {
		fmt.Println("retry in", d)
	}
	// Output: retry in 1s
}
