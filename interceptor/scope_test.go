package interceptor_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// incompressible returns n bytes of random hex, which PostgreSQL cannot
// compress below the size of its index entries.
func incompressible(n int) string {
	b := make([]byte, n/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestTenantsTheStoreCannotHoldAreRefused sends tenants past the bound of
// store.Scope.Validate over gRPC, to an atomic and a leased method: each gets
// a non-retriable INVALID_ARGUMENT that names the rule, and nothing runs or
// is written.
func TestTenantsTheStoreCannotHoldAreRefused(t *testing.T) {
	e := newEnv(t, setup{opts: []idem.Option{idem.WithMethodPolicy(maybeMethod, idem.MethodPolicy{Mode: idem.ModeLeased, Lease: time.Minute})}})
	call := func(method, tenant, key string) error {
		ctx := metadata.AppendToOutgoingContext(withKey(key), "x-tenant-id", tenant)
		if method == maybeMethod {
			_, err := e.client.Maybe(ctx, &testv1.MaybeRequest{Value: "v"})
			return err
		}
		_, err := e.client.Do(ctx, &testv1.DoRequest{Value: "v"})
		return err
	}
	for _, method := range []string{testv1.TestService_Do_FullMethodName, maybeMethod} {
		t.Run(method, func(t *testing.T) {
			for name, tenant := range map[string]string{
				"256 bytes": strings.Repeat("t", store.MaxTenantLength+1),
				"10 KB":     incompressible(10 << 10),
			} {
				t.Run(name, func(t *testing.T) {
					before := e.svc.count()
					err := call(method, tenant, "k-"+strings.ReplaceAll(name, " ", "-"))
					wantScopeInvalid(t, err, "tenant", fmt.Sprint(len(tenant)))
					if e.svc.count() != before {
						t.Fatal("the handler ran for a tenant the store cannot hold")
					}
				})
			}
			if n, k := e.effects(t), e.keys(t); n != 0 || k != 0 {
				t.Fatalf("refused tenants left %d effects and %d keys; want none", n, k)
			}
		})
	}
	// 255 bytes is the longest tenant accepted, and it replays.
	long := strings.Repeat("t", store.MaxTenantLength)
	for _, method := range []string{testv1.TestService_Do_FullMethodName, maybeMethod} {
		for range 2 {
			if err := call(method, long, "long"); err != nil {
				t.Fatalf("%s with a %d-byte tenant: %v", method, len(long), err)
			}
		}
	}
	if n, k := e.effects(t), e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND status = 'recorded'`, long); n != 2 || k != 2 {
		t.Fatalf("a 255-byte tenant on two methods, twice each: %d effects and %d completed keys; want 2 and 2", n, k)
	}
	if e.log.String() != "" {
		t.Errorf("refused tenants were logged:\n%s", e.log)
	}
}

// TestTenantBytesClientsCannotSend covers tenants that gRPC clients refuse
// to put in a header but HTTP/2 carries, by calling the interceptor with
// crafted metadata: text that is not UTF-8, or holds a NUL, is refused; a
// UTF-8 tenant of non-ASCII letters is a tenant like any other.
func TestTenantBytesClientsCannotSend(t *testing.T) {
	e := newEnv(t, setup{})
	info := &grpc.UnaryServerInfo{FullMethod: testv1.TestService_Do_FullMethodName}
	for _, leased := range []bool{false, true} {
		opts := []idem.Option{idem.WithTenant(idemtest.TenantFromHeader)}
		if leased {
			opts = append(opts, idem.WithMethodPolicy(info.FullMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute}))
		}
		intercept := interceptor.UnaryServerInterceptor(idemtest.NewEngine(t, postgres.New(e.pool), opts...))
		call := func(tenant, key string, handler grpc.UnaryHandler) (any, error) {
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idem.KeyHeader, key, "x-tenant-id", tenant))
			return intercept(ctx, &testv1.DoRequest{Value: "v"}, info, handler)
		}
		t.Run(fmt.Sprint("leased=", leased), func(t *testing.T) {
			for name, c := range map[string]struct{ tenant, rule string }{
				"not UTF-8":        {"bad-\xff\xfe", "UTF-8"},
				"Latin-1":          {"Z\xfcrich", "UTF-8"},
				"NUL":              {"ten\x00ant", "NUL"},
				"NUL and too long": {strings.Repeat("\x00", 300), "300"},
			} {
				t.Run(name, func(t *testing.T) {
					_, err := call(c.tenant, "k", func(context.Context, any) (any, error) {
						t.Fatal("handler called with a tenant the store cannot hold")
						return nil, nil
					})
					wantScopeInvalid(t, err, "tenant", c.rule)
				})
			}
			if k := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE key = 'k'`); k != 0 {
				t.Fatalf("%d keys written for refused tenants, want 0", k)
			}
			// UTF-8 of non-ASCII letters is a tenant like any other, apart
			// from its ASCII look-alike.
			key := fmt.Sprint("utf8-leased-", leased)
			for _, tenant := range []string{"Zürich", "東京", "Zurich"} {
				ran := false
				_, err := call(tenant, key, func(context.Context, any) (any, error) {
					ran = true
					return &testv1.DoResponse{Value: tenant}, nil
				})
				if err != nil || !ran {
					t.Fatalf("tenant %q: %v (ran %v); want a first execution", tenant, err, ran)
				}
				if n := e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND key = $2 AND status = 'recorded'`, tenant, key); n != 1 {
					t.Fatalf("tenant %q: %d completed keys, want 1", tenant, n)
				}
			}
		})
	}
}

// wantScopeInvalid fails t unless err is INVALID_ARGUMENT with ErrorInfo
// reason IDEMPOTENCY_SCOPE_INVALID and a short message that names field and
// contains rule.
func wantScopeInvalid(t *testing.T, err error, field, rule string) {
	t.Helper()
	st := wantCode(t, err, codes.InvalidArgument)
	info := errorInfo(st)
	if info.GetReason() != idem.ReasonScopeInvalid || info.GetDomain() != idem.Domain {
		t.Fatalf("ErrorInfo %v, want reason %s in domain %s", info, idem.ReasonScopeInvalid, idem.Domain)
	}
	if msg := st.Message(); !strings.Contains(msg, field) || !strings.Contains(msg, rule) || len(msg) > 200 {
		t.Fatalf("message %q: want a short one naming %s and %q", msg, field, rule)
	}
}
