package idemconnect_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/idemtest/grpctest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
	"github.com/idemkit/idem/transport"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// Procedures the tests serve.
const (
	createPayment = testv1.PaymentService_CreatePayment_FullMethodName
	getPayment    = testv1.PaymentService_GetPayment_FullMethodName
	do            = testv1.TestService_Do_FullMethodName
	// watch is a server-streaming procedure, for the refusal of keyed
	// streams; no descriptor declares it.
	watch = "/idem.test.v1.TestService/Watch"
)

// protocol is a way for connect-go's client to call: its protocol and
// codec.
type protocol struct {
	name string
	// grpc: the key goes as gRPC metadata, as it is; else as the IETF
	// header, a Structured Field String.
	grpc bool
	opts []connect.ClientOption
}

var protocols = []protocol{
	{name: "connect"},
	{name: "connect+json", opts: []connect.ClientOption{connect.WithProtoJSON()}},
	{name: "grpc", grpc: true, opts: []connect.ClientOption{connect.WithGRPC()}},
	{name: "grpcweb", opts: []connect.ClientOption{connect.WithGRPCWeb()}},
}

// eachProtocol runs f once per protocol.
func eachProtocol(t *testing.T, f func(t *testing.T, p protocol)) {
	t.Helper()
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) { f(t, p) })
	}
}

// header returns the value of the key header that carries key over p.
func (p protocol) header(key string) string {
	if p.grpc {
		return key
	}
	return transport.FormatHTTPKey(key)
}

// service implements the procedures. Each execution of CreatePayment
// inserts a payment on the transaction that holds its key (on PostgreSQL)
// and then calls hook, which decides the outcome.
type service struct {
	pool *pgxpool.Pool // nil on store/memory

	mu    sync.Mutex
	runs  int      // executions of CreatePayment, GetPayment and Do
	keys  []string // the key of each execution (idem.KeyFromContext)
	raw   []string // the key header of each execution, as it came
	ids   []string // the request_id of each execution's request ("" if none)
	hook  func(ctx context.Context, run int) error
	wrote int // payments written on store/memory
}

func (s *service) setHook(h func(ctx context.Context, run int) error) {
	s.mu.Lock()
	s.hook = h
	s.mu.Unlock()
}

// run counts an execution of the request msg and returns its number and
// the hook.
func (s *service) run(ctx context.Context, msg any) (int, func(context.Context, int) error) {
	key, _ := idem.KeyFromContext(ctx)
	raw := ""
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		raw = strings.Join(info.RequestHeader().Values(idem.HTTPKeyHeader), ",")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs++
	s.keys = append(s.keys, key)
	s.raw = append(s.raw, raw)
	id := ""
	if r, ok := msg.(interface{ GetRequestId() string }); ok {
		id = r.GetRequestId()
	}
	s.ids = append(s.ids, id)
	return s.runs, s.hook
}

// requestIDs returns the request_id of each execution's request.
func (s *service) requestIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}

// headers returns the key header of each execution, as it came.
func (s *service) headers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.raw...)
}

func (s *service) executions() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs, append([]string(nil), s.keys...)
}

func (s *service) createPayment(ctx context.Context, req *connect.Request[testv1.CreatePaymentRequest]) (*connect.Response[testv1.CreatePaymentResponse], error) {
	n, hook := s.run(ctx, req.Msg)
	id := "pay_" + strconv.Itoa(n)
	if s.pool != nil {
		tx, ok := postgres.TxFromContext(ctx)
		if !ok {
			return nil, connect.NewError(connect.CodeInternal, errors.New("no transaction"))
		}
		err := tx.QueryRow(ctx, `INSERT INTO payments (customer_id, amount_cents) VALUES ($1, $2) RETURNING 'pay_' || id`,
			req.Msg.GetCustomerId(), req.Msg.GetAmountCents()).Scan(&id)
		if err != nil {
			return nil, err
		}
	}
	if hook != nil {
		if err := hook(ctx, n); err != nil {
			return nil, err
		}
	}
	if s.pool == nil {
		s.mu.Lock()
		s.wrote++
		s.mu.Unlock()
	}
	resp := connect.NewResponse(&testv1.CreatePaymentResponse{Payment: &testv1.Payment{
		Id:          id,
		CustomerId:  req.Msg.GetCustomerId(),
		AmountCents: req.Msg.GetAmountCents(),
		Currency:    req.Msg.GetCurrency(),
	}})
	resp.Header().Set("X-Payment-Id", id)
	return resp, nil
}

func (s *service) getPayment(ctx context.Context, req *connect.Request[testv1.GetPaymentRequest]) (*connect.Response[testv1.GetPaymentResponse], error) {
	s.run(ctx, req.Msg)
	return connect.NewResponse(&testv1.GetPaymentResponse{Payment: &testv1.Payment{Id: req.Msg.GetId()}}), nil
}

func (s *service) do(ctx context.Context, req *connect.Request[testv1.DoRequest]) (*connect.Response[testv1.DoResponse], error) {
	n, _ := s.run(ctx, req.Msg)
	return connect.NewResponse(&testv1.DoResponse{
		Value:     req.Msg.GetValue(),
		Execution: int64(n),
		// Several entries, so that map order would show in the bytes.
		Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"},
	}), nil
}

// grpcPayments serves CreatePayment of svc to grpc-go.
type grpcPayments struct {
	testv1.UnimplementedPaymentServiceServer
	svc *service
}

func (g grpcPayments) CreatePayment(ctx context.Context, req *testv1.CreatePaymentRequest) (*testv1.CreatePaymentResponse, error) {
	resp, err := g.svc.createPayment(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// serveGRPC serves CreatePayment of e's service with grpc-go and idem's
// gRPC interceptor, on e's store, and returns a client of it.
func (e *env) serveGRPC(t *testing.T, opts ...idem.Option) testv1.PaymentServiceClient {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.UnaryServerInterceptor(idemtest.NewEngine(t, e.store, opts...))))
	testv1.RegisterPaymentServiceServer(srv, grpcPayments{svc: e.svc})
	return testv1.NewPaymentServiceClient(grpctest.Dial(t, grpctest.Start(t, srv)))
}

func (s *service) watch(ctx context.Context, req *connect.Request[testv1.ReadRequest], stream *connect.ServerStream[testv1.ReadResponse]) error {
	n, _ := s.run(ctx, req.Msg)
	return stream.Send(&testv1.ReadResponse{Value: req.Msg.GetValue(), Execution: int64(n)})
}

// env is a connect-go server of the procedures, with idem's interceptor,
// on 127.0.0.1 (HTTP/1.1, and HTTP/2 without TLS).
type env struct {
	pool  *pgxpool.Pool // nil on store/memory
	store store.Store
	svc   *service
	url   string
	// arrivals records the unary requests that reach the server, before
	// idem's interceptor: the refused ones too.
	arrivals *arrivals
	// client speaks HTTP/2 without TLS (as gRPC needs) and records the
	// body of each response.
	client *http.Client
	bodies *bodies
}

type setup struct {
	memory    bool
	storeOpts []postgres.Option
	memOpts   []memory.Option
	opts      []idem.Option
	// store, when set, is the store to serve (shared with another server).
	store store.Store
	pool  *pgxpool.Pool
}

func newEnv(t *testing.T, s setup) *env {
	t.Helper()
	e := &env{pool: s.pool, store: s.store}
	switch {
	case e.store != nil:
	case s.memory:
		e.store = memory.New(s.memOpts...)
	default:
		e.pool = pgtest.NewPool(t)
		if _, err := e.pool.Exec(t.Context(), `CREATE TABLE payments (
			id bigserial PRIMARY KEY, customer_id text NOT NULL, amount_cents bigint NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		e.store = postgres.New(e.pool, s.storeOpts...)
	}
	e.svc = &service{pool: e.pool}
	e.arrivals = &arrivals{}
	e.url = serve(t, e.svc, e.arrivals, idemconnect.NewInterceptor(idemtest.NewEngine(t, e.store, s.opts...)))
	e.bodies = &bodies{}
	e.client = &http.Client{Transport: &recordingTransport{next: h2cTransport(), bodies: e.bodies}}
	return e
}

// arrivals is a handler interceptor that records the key header of each
// unary request, as it came.
type arrivals struct {
	mu      sync.Mutex
	headers []string
}

func (a *arrivals) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a *arrivals) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (a *arrivals) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		a.mu.Lock()
		a.headers = append(a.headers, strings.Join(req.Header().Values(idem.HTTPKeyHeader), ","))
		a.mu.Unlock()
		return next(ctx, req)
	}
}

// keys returns the key header of each request that arrived, in order.
func (a *arrivals) keys() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.headers)
}

// serve serves the procedures of svc with the handler interceptors ics and
// returns the server's URL.
func serve(t *testing.T, svc *service, ics ...connect.Interceptor) string {
	t.Helper()
	opt := connect.WithInterceptors(ics...)
	mux := http.NewServeMux()
	mux.Handle(createPayment, connect.NewUnaryHandler(createPayment, svc.createPayment, opt))
	mux.Handle(getPayment, connect.NewUnaryHandler(getPayment, svc.getPayment, opt,
		connect.WithIdempotency(connect.IdempotencyNoSideEffects)))
	mux.Handle(do, connect.NewUnaryHandler(do, svc.do, opt))
	mux.Handle(watch, connect.NewServerStreamHandler(watch, svc.watch, opt))
	return serveMux(t, mux)
}

// serveMuxFor returns a mux of one procedure.
func serveMuxFor(procedure string, h http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(procedure, h)
	return mux
}

// serveMux serves mux on 127.0.0.1, over HTTP/1.1 and HTTP/2 without TLS,
// and returns its URL.
func serveMux(t *testing.T, mux *http.ServeMux) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// h2cTransport speaks HTTP/2 without TLS, which gRPC needs and the other
// protocols take.
func h2cTransport() *http.Transport {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return tr
}

// bodies keeps the body of each response, in order.
type bodies struct {
	mu  sync.Mutex
	all [][]byte
}

func (b *bodies) last() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.all) == 0 {
		return nil
	}
	return b.all[len(b.all)-1]
}

// recordingTransport reads each response body whole, keeps it in bodies
// and hands on a copy. Reading to the end also fills the response's
// trailers, which connect-go reads after the body.
type recordingTransport struct {
	next   http.RoundTripper
	bodies *bodies
}

func (rt *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	rt.bodies.mu.Lock()
	rt.bodies.all = append(rt.bodies.all, body)
	rt.bodies.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// newClient returns a client of procedure over p, with interceptors ics.
func newClient[Req, Res any](e *env, p protocol, procedure string, ics ...connect.Interceptor) *connect.Client[Req, Res] {
	opts := append([]connect.ClientOption{connect.WithInterceptors(ics...)}, p.opts...)
	return connect.NewClient[Req, Res](e.client, e.url+procedure, opts...)
}

// payments returns a client of CreatePayment over p.
func (e *env) payments(p protocol, ics ...connect.Interceptor) *connect.Client[testv1.CreatePaymentRequest, testv1.CreatePaymentResponse] {
	return newClient[testv1.CreatePaymentRequest, testv1.CreatePaymentResponse](e, p, createPayment, ics...)
}

// keyed returns a request for msg whose key header is value.
func keyed[T any](msg *T, value string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	if value != "" {
		req.Header().Set(idem.HTTPKeyHeader, value)
	}
	return req
}

func payment(amount int64) *testv1.CreatePaymentRequest {
	return &testv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: amount, Currency: "EUR"}
}

// count returns the result of a count(*) query on the test's database.
func (e *env) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// payments returns the number of payments that stayed: rows of payments,
// or, on store/memory, the executions that succeeded.
func (e *env) paid(t *testing.T) int {
	t.Helper()
	if e.pool == nil {
		e.svc.mu.Lock()
		defer e.svc.mu.Unlock()
		return e.svc.wrote
	}
	return e.count(t, `SELECT count(*) FROM payments`)
}

// keys returns the number of rows in the key table (0 on store/memory).
func (e *env) keys(t *testing.T) int {
	t.Helper()
	if e.pool == nil {
		return 0
	}
	return e.count(t, `SELECT count(*) FROM idempotency_keys`)
}

// wantCode fails the test unless err is a *connect.Error of code c, and
// returns it.
func wantCode(t *testing.T, err error, c connect.Code) *connect.Error {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != c {
		t.Fatalf("got %v, want code %v", err, c)
	}
	return ce
}

// detail returns the first error detail of type T in ce.
func detail[T proto.Message](ce *connect.Error) T {
	var zero T
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		if m, ok := v.(T); ok {
			return m
		}
	}
	return zero
}

// violation returns the BadRequest field violation in ce, if there is one.
func violation(ce *connect.Error) *errdetails.BadRequest_FieldViolation {
	br := detail[*errdetails.BadRequest](ce)
	if len(br.GetFieldViolations()) != 1 {
		return nil
	}
	return br.GetFieldViolations()[0]
}
