package adminlisten_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/admin"
	"github.com/idemkit/idem/examples/internal/adminlisten"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/gen/idem/admin/v1/adminv1connect"
	"github.com/idemkit/idem/interceptor/idemconnect"
	"github.com/idemkit/idem/internal/admingrpc"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// TestTokenAuthorizer: the demo authorizer refuses a call without the
// operator token, or with another, with UNAUTHENTICATED, and lets the
// operator list the keys, over gRPC (the listener of NewServer) and over
// Connect (a handler of idemconnect.NewAdminHandler) alike.
func TestTokenAuthorizer(t *testing.T) {
	st := memory.New()
	ctx := t.Context()
	k := store.Scope{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-1"}
	c, err := st.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{}); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)

	s, err := adminlisten.NewServer(adminlisten.Config{Store: st, Token: "s3cret", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	mux := http.NewServeMux()
	mux.Handle(idemconnect.NewAdminHandler(admin.NewServer(st, adminlisten.TokenAuthorizer("s3cret"), admin.WithLogger(logger))))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)

	for _, w := range []struct {
		name   string
		client adminv1connect.AdminServiceClient
		// authorization returns ctx with the authorization header v.
		authorization func(ctx context.Context, v string) context.Context
		code          func(error) codes.Code
	}{
		{"grpc", admingrpc.NewClient(conn),
			func(ctx context.Context, v string) context.Context {
				return metadata.AppendToOutgoingContext(ctx, "authorization", v)
			},
			status.Code},
		{"connect", adminv1connect.NewAdminServiceClient(hs.Client(), hs.URL),
			func(ctx context.Context, v string) context.Context {
				ctx, info := connect.NewClientContext(ctx)
				info.RequestHeader().Set("Authorization", v)
				return ctx
			},
			func(err error) codes.Code { return codes.Code(connect.CodeOf(err)) }},
	} {
		list := &adminv1.ListKeysRequest{Tenant: "acme"}
		for name, ctx := range map[string]context.Context{
			"no token":    ctx,
			"other token": w.authorization(ctx, "Bearer guess"),
			"not bearer":  w.authorization(ctx, "s3cret"),
		} {
			if _, err := w.client.ListKeys(ctx, list); w.code(err) != codes.Unauthenticated {
				t.Errorf("%s: ListKeys with %s: %v, want UNAUTHENTICATED", w.name, name, err)
			}
		}
		keys, err := w.client.ListKeys(w.authorization(ctx, "Bearer s3cret"), list)
		if err != nil || len(keys.GetKeys()) != 1 || keys.GetKeys()[0].GetKey() != "order-1" {
			t.Errorf("%s: ListKeys with the operator token: %v, %v; want order-1", w.name, keys, err)
		}
	}
}

// TestConsole: the console answers a browser without the token with a
// basic challenge, and shows the keys to one that sends the token as its
// password, or as a bearer token.
func TestConsole(t *testing.T) {
	st := memory.New()
	ctx := t.Context()
	k := store.Scope{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-1"}
	c, err := st.Claim(ctx, k, store.ClaimRequest{Fingerprint: []byte("fp")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if _, err := adminlisten.NewConsole(adminlisten.Config{Store: st}); err != adminlisten.ErrNoToken {
		t.Errorf("NewConsole without a token: %v", err)
	}
	h, err := adminlisten.NewConsole(adminlisten.Config{Store: st, Token: "s3cret", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string, auth func(*http.Request)) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != nil {
			auth(req)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if resp := get("/", nil); resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != adminlisten.ConsolePath {
		t.Errorf("/: %d %q, want a redirect to the console", resp.StatusCode, resp.Header.Get("Location"))
	}
	for name, auth := range map[string]func(*http.Request){
		"no token":    nil,
		"other token": func(r *http.Request) { r.SetBasicAuth("operator", "guess") },
	} {
		resp := get(adminlisten.ConsolePath, auth)
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("%s: %d %q, want 401 with a basic challenge", name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	for name, auth := range map[string]func(*http.Request){
		"basic":  func(r *http.Request) { r.SetBasicAuth("operator", "s3cret") },
		"bearer": func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") },
	} {
		resp := get(adminlisten.ConsolePath, auth)
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "order-1") {
			t.Errorf("%s: %d, %v\n%s", name, resp.StatusCode, err, body)
		}
	}
}
