package idemgateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemgateway"
	gatewaytestv1 "github.com/idemkit/idem/interceptor/idemgateway/internal/gen/idem/gatewaytest/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/internal/idemtest/grpctest"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
	"github.com/idemkit/idem/transport"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

const createMethod = gatewaytestv1.TransferService_CreateTransfer_FullMethodName

// service implements TransferService on the transaction of the request's
// idempotency key, and counts the calls that reach it.
type service struct {
	gatewaytestv1.UnimplementedTransferServiceServer
	pool  *pgxpool.Pool
	calls atomic.Int64 // of CreateTransfer
	reads atomic.Int64 // of GetTransfer

	mu sync.Mutex
	// hook, if set, runs first in CreateTransfer: it may block, or fail
	// the call.
	hook func(ctx context.Context) error
}

func (s *service) setHook(h func(ctx context.Context) error) {
	s.mu.Lock()
	s.hook = h
	s.mu.Unlock()
}

func (s *service) CreateTransfer(ctx context.Context, req *gatewaytestv1.CreateTransferRequest) (*gatewaytestv1.CreateTransferResponse, error) {
	s.calls.Add(1)
	s.mu.Lock()
	hook := s.hook
	s.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return nil, err
		}
	}
	if req.GetAmountCents() <= 0 {
		st, _ := status.New(codes.InvalidArgument, "invalid transfer").WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount_cents", Description: "must be positive"}},
		})
		return nil, st.Err()
	}
	if req.GetFromAccount() == req.GetToAccount() {
		return nil, status.Error(codes.FailedPrecondition, "cannot transfer to the same account")
	}
	tx, ok := postgres.TxFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "CreateTransfer must run under idem")
	}
	tenant, _ := tenantOf(ctx)
	key, _ := idem.KeyFromContext(ctx)
	t := &gatewaytestv1.Transfer{
		FromAccount: req.GetFromAccount(),
		ToAccount:   req.GetToAccount(),
		AmountCents: req.GetAmountCents(),
		Labels:      req.GetLabels(),
	}
	err := tx.QueryRow(ctx,
		`INSERT INTO transfers (tenant, from_account, to_account, amount_cents, request_key)
		 VALUES ($1, $2, $3, $4, $5) RETURNING id::text`,
		tenant, t.FromAccount, t.ToAccount, t.AmountCents, key).Scan(&t.Id)
	if err != nil {
		return nil, status.Error(codes.Unavailable, "storing the transfer failed")
	}
	return &gatewaytestv1.CreateTransferResponse{Transfer: t}, nil
}

func (s *service) GetTransfer(ctx context.Context, req *gatewaytestv1.GetTransferRequest) (*gatewaytestv1.GetTransferResponse, error) {
	s.reads.Add(1)
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	t := &gatewaytestv1.Transfer{}
	err = s.pool.QueryRow(ctx,
		`SELECT id::text, from_account, to_account, amount_cents FROM transfers WHERE tenant = $1 AND id::text = $2`,
		tenant, req.GetId()).Scan(&t.Id, &t.FromAccount, &t.ToAccount, &t.AmountCents)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, status.Error(codes.NotFound, "no such transfer")
	}
	if err != nil {
		return nil, status.Error(codes.Unavailable, "reading the transfer failed")
	}
	return &gatewaytestv1.GetTransferResponse{Transfer: t}, nil
}

// tenantOf reads the tenant from metadata x-tenant-id, which the gateway
// fills from the header X-Tenant-Id.
func tenantOf(ctx context.Context) (string, error) {
	v := metadata.ValueFromIncomingContext(ctx, "x-tenant-id")
	if len(v) != 1 {
		return "", status.Error(codes.Unauthenticated, "missing x-tenant-id")
	}
	return v[0], nil
}

// tenantHeaders forwards X-Tenant-Id to the gRPC server, and the rest as
// grpc-gateway does by default.
func tenantHeaders(key string) (string, bool) {
	if textproto.CanonicalMIMEHeaderKey(key) == "X-Tenant-Id" {
		return "x-tenant-id", true
	}
	return runtime.DefaultHeaderMatcher(key)
}

// env is a gRPC server with idem on PostgreSQL on 127.0.0.1, and a
// grpc-gateway in front of it with idemgateway's options.
type env struct {
	pool *pgxpool.Pool
	svc  *service
	url  string
	grpc gatewaytestv1.TransferServiceClient
}

type config struct {
	server []idem.Option
	store  []postgres.Option
}

func newEnv(t *testing.T, cfg config) *env {
	t.Helper()
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(t.Context(), `CREATE TABLE transfers (
		id bigserial PRIMARY KEY, tenant text NOT NULL, from_account text NOT NULL,
		to_account text NOT NULL, amount_cents bigint NOT NULL, request_key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	svc := &service{pool: pool}
	tenant := func(_ context.Context, header map[string][]string) (string, error) {
		if v := header["x-tenant-id"]; len(v) == 1 {
			return v[0], nil
		}
		return "", errors.New("missing x-tenant-id")
	}
	opts := append([]idem.Option{idem.WithTenant(tenant)}, cfg.server...)
	engine := idemtest.NewEngine(t, postgres.New(pool, cfg.store...), opts...)
	srv := grpc.NewServer(grpc.UnaryInterceptor(interceptor.UnaryServerInterceptor(engine)))
	gatewaytestv1.RegisterTransferServiceServer(srv, svc)
	conn := grpctest.Dial(t, grpctest.Start(t, srv))
	mux := runtime.NewServeMux(append(idemgateway.ServeMuxOptions(),
		runtime.WithIncomingHeaderMatcher(idemgateway.IncomingHeaderMatcher(tenantHeaders)))...)
	if err := gatewaytestv1.RegisterTransferServiceHandler(t.Context(), mux, conn); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return &env{pool: pool, svc: svc, url: hs.URL, grpc: gatewaytestv1.NewTransferServiceClient(conn)}
}

// reply is what the gateway answered.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// do sends an HTTP request to the gateway, with headers given as name,
// value pairs, as tenant acme unless they name another.
func (e *env) do(t *testing.T, method, path, body string, headers ...string) reply {
	t.Helper()
	r, err := e.send(t.Context(), method, path, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// send is do for other goroutines than the test's.
func (e *env) send(ctx context.Context, method, path, body string, headers ...string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("X-Tenant-Id", "acme")
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i < len(headers); i += 2 {
		if headers[i] == "X-Tenant-Id" {
			req.Header.Set(headers[i], headers[i+1])
			continue
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// create posts a CreateTransfer request.
func (e *env) create(t *testing.T, body string, headers ...string) reply {
	t.Helper()
	return e.do(t, http.MethodPost, "/v1/transfers", body, headers...)
}

const transfer = `{"fromAccount":"alice","toAccount":"bob","amountCents":"1250","labels":{"b":"2","a":"1","c":"3"}}`

// count returns the number of rows of a query of count(*).
func (e *env) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(t.Context(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// keyRow returns the status and response code of the key's row in
// idempotency_keys, and whether there is one.
func (e *env) keyRow(t *testing.T, tenant, key string) (state string, code int, ok bool) {
	t.Helper()
	var c *int
	err := e.pool.QueryRow(t.Context(),
		`SELECT status, response_code FROM idempotency_keys WHERE tenant = $1 AND method = $2 AND key = $3`,
		tenant, createMethod, key).Scan(&state, &c)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if c != nil {
		code = *c
	}
	return state, code, true
}

// problemBody is the JSON of a problem detail.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Reason string `json:"reason"`
}

// problem checks that r is a problem detail of status and reason, and
// returns it.
func problem(t *testing.T, r reply, status int, reason string) problemBody {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, r.body)
	}
	var p problemBody
	dec := json.NewDecoder(strings.NewReader(string(r.body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("body %s: %v", r.body, err)
	}
	if p.Status != status || p.Reason != reason || p.Title == "" || p.Detail == "" ||
		!strings.HasPrefix(p.Type, "https://pkg.go.dev/github.com/idemkit/idem") || !strings.HasSuffix(p.Type, "#"+reasonConst(reason)) {
		t.Fatalf("problem %+v; want status %d, reason %s, a title, a detail and a type", p, status, reason)
	}
	if got := r.header.Get(idem.HTTPReplayedHeader); got != "" {
		t.Fatalf("%s: %q on a refusal", idem.HTTPReplayedHeader, got)
	}
	return p
}

// TestReplay: the first call runs and records; its retry, with the key
// quoted or bare, gets the same JSON with Idempotent-Replayed: true, and
// nothing runs again.
func TestReplay(t *testing.T) {
	e := newEnv(t, config{})
	first := e.create(t, transfer, "Idempotency-Key", `"order-1"`)
	if first.status != http.StatusOK {
		t.Fatalf("first call: %d %s", first.status, first.body)
	}
	if got := first.header.Get(idem.HTTPReplayedHeader); got != "" {
		t.Fatalf("first call: %s: %q", idem.HTTPReplayedHeader, got)
	}
	var resp gatewaytestv1.CreateTransferResponse
	if err := protojson.Unmarshal(first.body, &resp); err != nil {
		t.Fatalf("first call: %s: %v", first.body, err)
	}
	if resp.GetTransfer().GetId() == "" || len(resp.GetTransfer().GetLabels()) != 3 {
		t.Fatalf("first call: %s", first.body)
	}
	// The quoted key is stored as the key itself, which gRPC clients send.
	if state, code, ok := e.keyRow(t, "acme", "order-1"); !ok || state != "recorded" || code != 0 {
		t.Fatalf("key row: %q %d %v; want completed with code 0", state, code, ok)
	}

	for _, key := range []string{"order-1", `"order-1"`, ` "order-1"`} {
		again := e.create(t, transfer, "Idempotency-Key", key)
		if again.status != http.StatusOK || again.header.Get(idem.HTTPReplayedHeader) != "true" {
			t.Fatalf("retry with %s: %d, %s: %q; want 200 and true", key, again.status,
				idem.HTTPReplayedHeader, again.header.Get(idem.HTTPReplayedHeader))
		}
		if string(again.body) != string(first.body) {
			t.Fatalf("retry with %s:\n%s\nwant the first answer:\n%s", key, again.body, first.body)
		}
	}
	if n := e.svc.calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if n := e.count(t, `SELECT count(*) FROM transfers WHERE request_key = 'order-1'`); n != 1 {
		t.Fatalf("%d transfers, want 1", n)
	}
}

// TestKeyMissing: a method that requires a key refuses a request without
// one with 400, before anything runs or is written.
func TestKeyMissing(t *testing.T) {
	e := newEnv(t, config{})
	r := e.create(t, transfer)
	p := problem(t, r, http.StatusBadRequest, idem.ReasonKeyMissing)
	if !strings.Contains(p.Detail, "Idempotency-Key") {
		t.Fatalf("detail %q does not name the header", p.Detail)
	}
	if n := e.svc.calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times, want 0", n)
	}
	if n := e.count(t, `SELECT count(*) FROM idempotency_keys`) + e.count(t, `SELECT count(*) FROM transfers`); n != 0 {
		t.Fatalf("%d rows, want none", n)
	}
}

// TestKeyMalformed: a malformed Idempotency-Key is refused with 400 and a
// detail that says what is wrong, on every route, and the service is not
// called.
func TestKeyMalformed(t *testing.T) {
	e := newEnv(t, config{})
	for _, c := range []struct {
		name, path string
		values     []string
		want       string
	}{
		{"unterminated", "/v1/transfers", []string{`"order-3`}, "Structured Field String"},
		{"space", "/v1/transfers", []string{`"order 3"`}, "visible ASCII"},
		{"empty", "/v1/transfers", []string{``}, "must not be empty"},
		{"empty quoted", "/v1/transfers", []string{`""`}, "must not be empty"},
		{"stray quote", "/v1/transfers", []string{`order"3`}, "double quote"},
		{"after the quote", "/v1/transfers", []string{`"order-3"x`}, "Structured Field String"},
		{"too long", "/v1/transfers", []string{strings.Repeat("k", 256)}, "at most 255 bytes"},
		{"two headers", "/v1/transfers", []string{"order-3", "order-4"}, "sent 2 times"},
		// Two header lines as a proxy merges them into one.
		{"comma-joined", "/v1/transfers", []string{"order-3,order-4"}, "more than one key"},
		{"comma-joined, spaced", "/v1/transfers", []string{"order-3, order-4"}, "more than one key"},
		{"a list of Strings", "/v1/transfers", []string{`"order-3", "order-4"`}, "more than one key"},
		{"parameters", "/v1/transfers", []string{`"order-3";p=1`}, "parameters"},
		{"not a token", "/v1/transfers", []string{`order:3`}, "token"},
		{"on a method idem stands aside from", "/v1/transfers/1", []string{`"order-3`}, "Structured Field String"},
		{"comma-joined, on a method idem stands aside from", "/v1/transfers/1", []string{"order-3,order-4"}, "more than one key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var headers []string
			for _, v := range c.values {
				headers = append(headers, "Idempotency-Key", v)
			}
			method := http.MethodPost
			if c.path != "/v1/transfers" {
				method = http.MethodGet
			}
			r := e.do(t, method, c.path, transfer, headers...)
			p := problem(t, r, http.StatusBadRequest, idem.ReasonKeyInvalid)
			if !strings.Contains(p.Detail, c.want) || !strings.Contains(p.Detail, "Idempotency-Key") {
				t.Fatalf("detail %q; want it to name the header and say %q", p.Detail, c.want)
			}
		})
	}
	if n := e.svc.calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times, want 0", n)
	}
	if n := e.count(t, `SELECT count(*) FROM idempotency_keys`) + e.count(t, `SELECT count(*) FROM transfers`); n != 0 {
		t.Fatalf("%d rows, want none", n)
	}
}

// TestKeyInUse: a retry while the first request still runs is answered
// with 409 and Retry-After, the RetryInfo delay rounded up; once the first
// completes, the retry replays it.
func TestKeyInUse(t *testing.T) {
	e := newEnv(t, config{
		server: []idem.Option{idem.WithRetryDelay(1500 * time.Millisecond)},
		store:  []postgres.Option{postgres.WithLockTimeout(200 * time.Millisecond)},
	})
	// The lock timeout bounds a claim's wait for a connection too: open
	// the two the requests need before they do.
	var conns []*pgxpool.Conn
	for range 2 {
		c, err := e.pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	entered, release := make(chan struct{}), make(chan struct{})
	releaseFirst := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseFirst) // before the pool closes, which waits for the first call's connection
	var once sync.Once
	e.svc.setHook(func(ctx context.Context) error {
		once.Do(func() {
			close(entered)
			<-release
		})
		return nil
	})
	type result struct {
		r   reply
		err error
	}
	firstDone := make(chan result, 1)
	go func() {
		r, err := e.send(t.Context(), http.MethodPost, "/v1/transfers", transfer, "Idempotency-Key", "order-5")
		firstDone <- result{r, err}
	}()
	select {
	case <-entered:
	case first := <-firstDone:
		t.Fatalf("the first call ended before its handler ran: %v %d %s", first.err, first.r.status, first.r.body)
	}

	r := e.create(t, transfer, "Idempotency-Key", "order-5")
	problem(t, r, http.StatusConflict, idem.ReasonKeyInUse)
	if got := r.header.Get("Retry-After"); got != "2" {
		t.Fatalf("Retry-After %q, want 2 (1.5 s rounded up)", got)
	}
	releaseFirst()
	if first := <-firstDone; first.err != nil || first.r.status != http.StatusOK {
		t.Fatalf("first call: %v %d %s", first.err, first.r.status, first.r.body)
	}
	again := e.create(t, transfer, "Idempotency-Key", "order-5")
	if again.status != http.StatusOK || again.header.Get(idem.HTTPReplayedHeader) != "true" {
		t.Fatalf("retry after the first completed: %d %s", again.status, again.body)
	}
	if n := e.svc.calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if n := e.count(t, `SELECT count(*) FROM transfers`); n != 1 {
		t.Fatalf("%d transfers, want 1", n)
	}
}

// TestMixedTransports: a call over gRPC and its retry over HTTP, or the
// other way round, are one operation: the retry replays the first answer,
// the JSON rendered from the recorded message.
func TestMixedTransports(t *testing.T) {
	e := newEnv(t, config{})
	req := &gatewaytestv1.CreateTransferRequest{FromAccount: "alice", ToAccount: "bob", AmountCents: 1250,
		Labels: map[string]string{"b": "2", "a": "1", "c": "3"}}
	grpcCtx := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(t.Context(), idem.KeyHeader, key, "x-tenant-id", "acme")
	}

	t.Run("gRPC, then HTTP", func(t *testing.T) {
		first, err := e.grpc.CreateTransfer(grpcCtx("mixed-1"), req)
		if err != nil {
			t.Fatal(err)
		}
		r := e.create(t, transfer, "Idempotency-Key", transport.FormatHTTPKey("mixed-1"))
		if r.status != http.StatusOK || r.header.Get(idem.HTTPReplayedHeader) != "true" {
			t.Fatalf("HTTP retry: %d %q %s", r.status, r.header.Get(idem.HTTPReplayedHeader), r.body)
		}
		var again gatewaytestv1.CreateTransferResponse
		if err := protojson.Unmarshal(r.body, &again); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&again, first) {
			t.Fatalf("HTTP retry: %v; want the gRPC answer %v", &again, first)
		}
	})
	t.Run("HTTP, then gRPC", func(t *testing.T) {
		r := e.create(t, transfer, "Idempotency-Key", "mixed-2")
		if r.status != http.StatusOK {
			t.Fatalf("HTTP call: %d %s", r.status, r.body)
		}
		var first gatewaytestv1.CreateTransferResponse
		if err := protojson.Unmarshal(r.body, &first); err != nil {
			t.Fatal(err)
		}
		var header metadata.MD
		again, err := e.grpc.CreateTransfer(grpcCtx("mixed-2"), req, grpc.Header(&header))
		if err != nil {
			t.Fatal(err)
		}
		if got := header.Get(idem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
			t.Fatalf("gRPC retry: %s %v", idem.ReplayedHeader, got)
		}
		if !proto.Equal(again, &first) {
			t.Fatalf("gRPC retry: %v; want the HTTP answer %v", again, &first)
		}
	})
	if n := e.svc.calls.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
	if n := e.count(t, `SELECT count(*) FROM transfers`); n != 2 {
		t.Fatalf("%d transfers, want 2", n)
	}
}

// TestOtherReasons: idem's other refusals get problem details too, with the
// status grpc-gateway gives their code.
func TestOtherReasons(t *testing.T) {
	t.Run("response not cached", func(t *testing.T) {
		e := newEnv(t, config{server: []idem.Option{idem.WithMaxStoredResponseBytes(1)}})
		if r := e.create(t, transfer, "Idempotency-Key", "order-9"); r.status != http.StatusOK {
			t.Fatalf("first call: %d %s", r.status, r.body)
		}
		r := e.create(t, transfer, "Idempotency-Key", "order-9")
		problem(t, r, http.StatusBadRequest, idem.ReasonResponseNotCached)
		if n := e.svc.calls.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want 1", n)
		}
		if n := e.count(t, `SELECT count(*) FROM transfers`); n != 1 {
			t.Fatalf("%d transfers, want 1", n)
		}
	})
	t.Run("scope invalid", func(t *testing.T) {
		e := newEnv(t, config{})
		r := e.create(t, transfer, "Idempotency-Key", "order-10", "X-Tenant-Id", strings.Repeat("t", 256))
		p := problem(t, r, http.StatusBadRequest, idem.ReasonScopeInvalid)
		if !strings.Contains(p.Detail, "tenant") {
			t.Fatalf("detail %q does not name the tenant", p.Detail)
		}
		if n := e.svc.calls.Load(); n != 0 {
			t.Fatalf("the handler ran %d times, want 0", n)
		}
		if n := e.count(t, `SELECT count(*) FROM idempotency_keys`); n != 0 {
			t.Fatalf("%d key rows, want 0", n)
		}
	})
	t.Run("not idem's", func(t *testing.T) {
		e := newEnv(t, config{})
		r := e.do(t, http.MethodGet, "/v1/transfers/404", "")
		if r.status != http.StatusNotFound || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("%d %s %s; want grpc-gateway's 404", r.status, r.header.Get("Content-Type"), r.body)
		}
	})
}

// reasonConst returns the name of the constant of reason in package idem
// (or idemgateway): IDEMPOTENCY_KEY_REUSED is ReasonKeyReused.
func reasonConst(reason string) string {
	name := "Reason"
	for w := range strings.SplitSeq(strings.TrimPrefix(reason, "IDEMPOTENCY_"), "_") {
		name += w[:1] + strings.ToLower(w[1:])
	}
	return name
}
