package admin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/admin"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/gen/idem/admin/v1/adminv1connect"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemconnect"
	"github.com/idemkit/idem/internal/admingrpc"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/record"
	"github.com/idemkit/idem/store"
)

var epoch = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

const doMethod = "/idem.test.v1.TestService/Do"

// allowAll grants every tenant to "root".
var allowAll = admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
	return admin.Grant{Subject: "root", AllTenants: true}, nil
})

// lockedBuffer is a log sink the server and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A wire is a transport the tests serve the admin service on: each test
// of the service's behaviour runs on every wire.
type wire struct {
	name string
	// start serves srv on the wire until t ends, and returns a client.
	start func(t *testing.T, srv *admin.Server) client
	// unauthenticated is the wire's own error with code UNAUTHENTICATED.
	unauthenticated func(msg string) error
}

// client is a client of the admin service on one wire.
type client struct {
	adminv1connect.AdminServiceClient
	// invoke calls the RPC fullMethod with in, discarding the response.
	invoke func(ctx context.Context, fullMethod string, in *dynamicpb.Message) error
	// withHeader returns ctx with the request headers kv, name and value
	// pairs.
	withHeader func(ctx context.Context, kv ...string) context.Context
}

var wires = []wire{
	{
		name: "grpc",
		start: func(t *testing.T, srv *admin.Server) client {
			s := grpc.NewServer()
			interceptor.RegisterAdmin(s, srv)
			conn := dialServer(t, s)
			return client{
				AdminServiceClient: admingrpc.NewClient(conn),
				invoke: func(ctx context.Context, fullMethod string, in *dynamicpb.Message) error {
					return conn.Invoke(ctx, fullMethod, in, &emptypb.Empty{})
				},
				withHeader: metadata.AppendToOutgoingContext,
			}
		},
		unauthenticated: func(msg string) error { return status.Error(codes.Unauthenticated, msg) },
	},
	{
		name: "connect",
		start: func(t *testing.T, srv *admin.Server) client {
			mux := http.NewServeMux()
			mux.Handle(idemconnect.NewAdminHandler(srv))
			hs := httptest.NewServer(mux)
			t.Cleanup(hs.Close)
			return client{
				AdminServiceClient: adminv1connect.NewAdminServiceClient(hs.Client(), hs.URL),
				invoke: func(ctx context.Context, fullMethod string, in *dynamicpb.Message) error {
					_, err := connect.NewClient[dynamicpb.Message, emptypb.Empty](hs.Client(), hs.URL+fullMethod).
						CallUnary(ctx, connect.NewRequest(in))
					return err
				},
				withHeader: func(ctx context.Context, kv ...string) context.Context {
					ctx, info := connect.NewClientContext(ctx)
					for i := 0; i+1 < len(kv); i += 2 {
						name, value := kv[i], kv[i+1]
						if strings.HasSuffix(strings.ToLower(name), "-bin") {
							value = connect.EncodeBinaryHeader([]byte(value)) // as grpc-go sends it
						}
						info.RequestHeader().Add(name, value)
					}
					return ctx
				},
			}
		},
		unauthenticated: func(msg string) error { return connect.NewError(connect.CodeUnauthenticated, errors.New(msg)) },
	},
}

// onEachWire runs test on every wire, as a subtest.
func onEachWire(t *testing.T, test func(t *testing.T, w wire)) {
	for _, w := range wires {
		t.Run(w.name, func(t *testing.T) { test(t, w) })
	}
}

// serve serves an admin server over st on w and returns its client.
func (w wire) serve(t *testing.T, st store.Admin, authz admin.Authorizer, opts ...admin.Option) client {
	t.Helper()
	return w.start(t, admin.NewServer(st, authz, opts...))
}

// dialServer serves s on an in-memory listener until t ends, and returns
// a connection to it.
func dialServer(t *testing.T, s *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func recorded(t *testing.T, c code.Code, msg proto.Message) *store.Outcome {
	t.Helper()
	body, _, err := record.Encode(c, msg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &store.Outcome{Code: c, Body: body}
}

func info(tenant, method, key string, state store.State, created time.Time) store.KeyInfo {
	return store.KeyInfo{Scope: store.Scope{Tenant: tenant, Method: method, Key: key}, State: state,
		Fingerprint: []byte{0xfe, 0xed}, CreatedAt: created, UpdatedAt: created, ExpiresAt: created.Add(24 * time.Hour)}
}

// wantCode fails t unless err, from a client of either wire, has code
// want, and returns its message.
func wantCode(t *testing.T, err error, want codes.Code) string {
	t.Helper()
	got, msg := codeOf(err)
	if got != want {
		t.Fatalf("got %v (%q), want %v", got, msg, want)
	}
	return msg
}

// codeOf returns the code and message of err, a gRPC status or a
// *connect.Error; OK for nil.
func codeOf(err error) (codes.Code, string) {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return codes.Code(ce.Code()), ce.Message()
	}
	st := status.Convert(err)
	return st.Code(), st.Message()
}

// TestRefusedEveryRPC calls every method of the service, as its descriptor
// lists them, on every wire, with an authorizer that refuses: each is
// refused, the authorizer is asked with the method's full name, and the
// store is never reached. A new RPC that skips authorization, on either
// wire, fails here.
func TestRefusedEveryRPC(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		st := &fakeStore{keys: []store.KeyInfo{info("acme", doMethod, "k1", store.Recorded, epoch)}}
		var asked []string
		var mu sync.Mutex
		refuse := admin.AuthorizerFunc(func(_ context.Context, r admin.Request) (admin.Grant, error) {
			mu.Lock()
			asked = append(asked, r.Method)
			mu.Unlock()
			return admin.Grant{}, errors.New("no certificate: dial with the operators' one")
		})
		c := w.serve(t, st, refuse)
		sd := adminv1.File_idem_admin_v1_admin_proto.Services().ByName("AdminService")
		methods := sd.Methods()
		if methods.Len() == 0 {
			t.Fatal("the service declares no method")
		}
		var want []string
		for i := range methods.Len() {
			md := methods.Get(i)
			full := "/" + string(sd.FullName()) + "/" + string(md.Name())
			for _, in := range []*dynamicpb.Message{dynamicpb.NewMessage(md.Input()), filled(md.Input())} {
				msg := wantCode(t, c.invoke(t.Context(), full, in), codes.PermissionDenied)
				if strings.Contains(msg, "certificate") {
					t.Errorf("%s: the authorizer's error reached the client: %q", full, msg)
				}
				want = append(want, full)
			}
		}
		if n := st.storeCalls(); n != 0 {
			t.Errorf("refused calls reached the store %d times", n)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(asked, want) {
			t.Errorf("the authorizer was asked for\n%q\nwant\n%q", asked, want)
		}
	})
}

// filled returns a request of d naming tenant "acme", method Do, key k1,
// force, and for the RPCs on many keys a selection of those and a limit,
// where it can, so that refusals are not down to an empty request.
func filled(d protoreflect.MessageDescriptor) *dynamicpb.Message {
	m := dynamicpb.NewMessage(d)
	for name, v := range map[protoreflect.Name]protoreflect.Value{
		"tenant": protoreflect.ValueOfString("acme"), "method": protoreflect.ValueOfString(doMethod),
		"key": protoreflect.ValueOfString("k1"), "force": protoreflect.ValueOfBool(true),
	} {
		if fd := d.Fields().ByName(name); fd != nil {
			m.Set(fd, v)
		}
	}
	// The RPCs on many keys: a selection of tenant acme, and a limit.
	if fd := d.Fields().ByName("selection"); fd != nil {
		m.Set(fd, protoreflect.ValueOfMessage(filled(fd.Message())))
	}
	if fd := d.Fields().ByName("limit"); fd != nil {
		m.Set(fd, protoreflect.ValueOfInt32(10))
	}
	return m
}

// TestAuthorizerStatus: an authorizer's refusal with a status is answered
// with its code and message on every wire, whether it is an *idem.Error
// or a wire's own error, that of the call's wire or of the other.
func TestAuthorizerStatus(t *testing.T) {
	refusals := map[string]error{"idem.NewError": idem.NewError(code.Code_UNAUTHENTICATED, "no credentials")}
	for _, w := range wires {
		refusals[w.name] = w.unauthenticated("no credentials")
	}
	onEachWire(t, func(t *testing.T, w wire) {
		for name, refusal := range refusals {
			st := &fakeStore{}
			c := w.serve(t, st, admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
				return admin.Grant{}, fmt.Errorf("checking the token: %w", refusal)
			}))
			_, err := c.GetKey(t.Context(), &adminv1.GetKeyRequest{Tenant: "acme", Method: doMethod, Key: "k1"})
			if got, msg := codeOf(err); got != codes.Unauthenticated || !strings.Contains(msg, "no credentials") {
				t.Errorf("an authorizer's %s error: got %v (%q), want Unauthenticated saying no credentials", name, got, msg)
			}
			if n := st.storeCalls(); n != 0 {
				t.Errorf("an authorizer's %s error: the refused call reached the store %d times", name, n)
			}
		}
	})
}

// TestAuthorizerSeesCaller: the authorizer gets the request headers as
// gRPC metadata carries them, whichever the wire, and the TLS state only
// over TLS (cmd/idem's TestTLS has a call over TLS); a Server's method
// called directly has no header.
func TestAuthorizerSeesCaller(t *testing.T) {
	var (
		mu  sync.Mutex
		got []admin.Request
	)
	record := admin.AuthorizerFunc(func(_ context.Context, r admin.Request) (admin.Grant, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r)
		return admin.Grant{Subject: "root", AllTenants: true}, nil
	})
	last := func() admin.Request {
		mu.Lock()
		defer mu.Unlock()
		return got[len(got)-1]
	}
	onEachWire(t, func(t *testing.T, w wire) {
		c := w.serve(t, &fakeStore{}, record)
		ctx := c.withHeader(t.Context(), "Authorization", "Bearer s3cret", "X-Operator-Bin", string([]byte{0, 1, 0xff}))
		if _, err := c.ListKeys(ctx, &adminv1.ListKeysRequest{Tenant: "acme"}); err != nil {
			t.Fatal(err)
		}
		r := last()
		if v := r.Header["authorization"]; !slices.Equal(v, []string{"Bearer s3cret"}) {
			t.Errorf("the authorizer saw authorization %q, want [Bearer s3cret]; header %v", v, r.Header)
		}
		if v := r.Header["x-operator-bin"]; !slices.Equal(v, []string{"\x00\x01\xff"}) {
			t.Errorf("the authorizer saw x-operator-bin %q, want the bytes sent; header %v", v, r.Header)
		}
		if r.TLS != nil || r.Method != "/idem.admin.v1.AdminService/ListKeys" || r.Tenant != "acme" {
			t.Errorf("the authorizer was asked %+v", r)
		}
	})
	srv := admin.NewServer(&fakeStore{}, record)
	if _, err := srv.ListKeys(t.Context(), &adminv1.ListKeysRequest{Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	if r := last(); r.Header != nil || r.TLS != nil {
		t.Errorf("a direct call's authorizer saw header %v and TLS %v, want none", r.Header, r.TLS)
	}
}

func TestTenantScope(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		st := &fakeStore{keys: []store.KeyInfo{
			info("acme", doMethod, "k1", store.Recorded, epoch),
			info("globex", doMethod, "k2", store.Recorded, epoch),
		}}
		var got []admin.Request
		var mu sync.Mutex
		c := w.serve(t, st, admin.AuthorizerFunc(func(_ context.Context, r admin.Request) (admin.Grant, error) {
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
			return admin.Grant{Subject: "alice", Tenants: []string{"acme"}}, nil
		}))
		ctx := t.Context()

		if _, err := c.GetKey(ctx, &adminv1.GetKeyRequest{Tenant: "acme", Method: doMethod, Key: "k1"}); err != nil {
			t.Fatalf("own tenant: %v", err)
		}
		_, err := c.GetKey(ctx, &adminv1.GetKeyRequest{Tenant: "globex", Method: doMethod, Key: "k2"})
		wantCode(t, err, codes.PermissionDenied)
		_, err = c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "globex", Method: doMethod, Key: "k2", Force: true, Reason: "r"})
		wantCode(t, err, codes.PermissionDenied)
		_, err = c.SettleKey(ctx, &adminv1.SettleKeyRequest{Tenant: "globex", Method: doMethod, Key: "k2",
			Status: &spb.Status{Code: int32(codes.FailedPrecondition)}})
		wantCode(t, err, codes.PermissionDenied)
		_, err = c.ListKeys(ctx, &adminv1.ListKeysRequest{AllTenants: true})
		wantCode(t, err, codes.PermissionDenied)
		_, err = c.ListKeys(ctx, &adminv1.ListKeysRequest{Tenant: "globex"})
		wantCode(t, err, codes.PermissionDenied)
		resp, err := c.ListKeys(ctx, &adminv1.ListKeysRequest{Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetKeys()) != 1 || resp.GetKeys()[0].GetKey() != "k1" {
			t.Errorf("acme's keys: %v", resp.GetKeys())
		}
		if len(st.keys) != 2 {
			t.Errorf("a refused forget deleted a key: %d left", len(st.keys))
		}
		want := admin.Request{Method: adminv1connect.AdminServiceForgetKeyProcedure, Tenant: "globex",
			Key: store.Scope{Tenant: "globex", Method: doMethod, Key: "k2"}, Force: true, Reason: "r"}
		mu.Lock()
		defer mu.Unlock()
		asked := got[2]
		asked.Header = nil // the wire's (TestAuthorizerSeesCaller)
		if asked.Peer == "" {
			t.Errorf("the authorizer was asked with no peer")
		}
		asked.Peer = "" // the wire's
		if !reflect.DeepEqual(asked, want) {
			t.Errorf("the authorizer was asked %+v, want %+v", asked, want)
		}
	})
}

func TestNotFoundAndInvalid(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		c := w.serve(t, &fakeStore{}, allowAll)
		ctx := t.Context()
		_, err := c.GetKey(ctx, &adminv1.GetKeyRequest{Tenant: "acme", Method: doMethod, Key: "nope"})
		wantCode(t, err, codes.NotFound)
		_, err = c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: "nope"})
		wantCode(t, err, codes.NotFound)
		_, err = c.SettleKey(ctx, &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "nope", Status: &spb.Status{Code: 9}})
		wantCode(t, err, codes.NotFound)

		_, err = c.GetKey(ctx, &adminv1.GetKeyRequest{Tenant: "acme", Method: doMethod})
		wantCode(t, err, codes.InvalidArgument)
		_, err = c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: strings.Repeat("k", 256)})
		wantCode(t, err, codes.InvalidArgument)
		_, err = c.SettleKey(ctx, &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "k", Status: &spb.Status{}})
		wantCode(t, err, codes.InvalidArgument)
		_, err = c.ListKeys(ctx, &adminv1.ListKeysRequest{Tenant: "acme", AllTenants: true})
		wantCode(t, err, codes.InvalidArgument)
		_, err = c.ListKeys(ctx, &adminv1.ListKeysRequest{States: []adminv1.KeyState{adminv1.KeyState_KEY_STATE_UNSPECIFIED}})
		wantCode(t, err, codes.InvalidArgument)
	})
}

// TestListKeysRefusesAnInvalidFilter: a tenant or method filter that no
// key can hold (a NUL byte, past its bound) is the caller's mistake,
// answered INVALID_ARGUMENT naming the rule before the store is asked, as
// GetKey answers such a key; never a store failure logged at ERROR.
func TestListKeysRefusesAnInvalidFilter(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		st := &fakeStore{keys: []store.KeyInfo{info("acme", doMethod, "k1", store.Recorded, epoch)}}
		var logs lockedBuffer
		c := w.serve(t, st, allowAll, admin.WithLogger(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
		for _, tc := range []struct {
			req  *adminv1.ListKeysRequest
			rule string
		}{
			{&adminv1.ListKeysRequest{Tenant: "a\x00b"}, "tenant filter contains a NUL byte"},
			{&adminv1.ListKeysRequest{Tenant: strings.Repeat("t", store.MaxTenantLength+1)}, "tenant filter is 256 bytes, longer than the 255 allowed"},
			{&adminv1.ListKeysRequest{Tenant: "acme", Method: "/a\x00b"}, "method filter contains a NUL byte"},
			{&adminv1.ListKeysRequest{AllTenants: true, Method: "/a\x00b"}, "method filter contains a NUL byte"},
			{&adminv1.ListKeysRequest{AllTenants: true, Method: strings.Repeat("m", store.MaxMethodLength+1)}, "method filter is 1025 bytes"},
		} {
			_, err := c.ListKeys(t.Context(), tc.req)
			if msg := wantCode(t, err, codes.InvalidArgument); !strings.Contains(msg, tc.rule) {
				t.Errorf("ListKeys(%q, %q): %q, want the rule (%q) named", tc.req.GetTenant(), tc.req.GetMethod(), msg, tc.rule)
			}
		}
		if n := st.storeCalls(); n != 0 {
			t.Errorf("invalid filters reached the store %d times", n)
		}
		if strings.Contains(logs.String(), `"level":"ERROR"`) {
			t.Errorf("an invalid filter was logged as a failure:\n%s", logs.String())
		}
	})
}

// TestSettleRefusesCodesClientsRetry: a settled key answers every retry
// with its status, without RetryInfo, until it expires, so a code that
// clients retry (ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED,
// DEADLINE_EXCEEDED) would have them spend every attempt on an answer
// that never changes. It is refused with INVALID_ARGUMENT naming the rule,
// as OK and codes outside gRPC's are, before the store is asked.
func TestSettleRefusesCodesClientsRetry(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		held := info("acme", doMethod, "held", store.Abandoned, epoch)
		st := &fakeStore{now: epoch, keys: []store.KeyInfo{held}}
		c := w.serve(t, st, allowAll)
		for _, tc := range []struct {
			code codes.Code
			rule string
		}{
			{codes.Aborted, "ABORTED is a code clients retry"},
			{codes.Unavailable, "UNAVAILABLE is a code clients retry"},
			{codes.ResourceExhausted, "RESOURCE_EXHAUSTED is a code clients retry"},
			{codes.DeadlineExceeded, "DEADLINE_EXCEEDED is a code clients retry"},
			{codes.OK, "must be an error's gRPC code"},
			{17, "must be an error's gRPC code"},
		} {
			_, err := c.SettleKey(t.Context(), &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "held", Force: true, Reason: "r",
				Status: &spb.Status{Code: int32(tc.code), Message: "settled by an operator"}})
			if msg := wantCode(t, err, codes.InvalidArgument); !strings.Contains(msg, tc.rule) {
				t.Errorf("settle with %v: %q, want the rule (%q) named", tc.code, msg, tc.rule)
			}
		}
		if n := st.storeCalls(); n != 0 {
			t.Errorf("refused settles reached the store %d times", n)
		}
		st.mu.Lock()
		if ki := st.keys[0]; ki.State != store.Abandoned || ki.Outcome != nil {
			t.Errorf("the key after the refused settles: %+v, want it abandoned as it was", ki)
		}
		st.mu.Unlock()

		resp, err := c.SettleKey(t.Context(), &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "held",
			Status: &spb.Status{Code: int32(codes.FailedPrecondition), Message: "cancelled by an operator"}})
		if err != nil || resp.GetKey().GetOutcome().GetCode() != int32(codes.FailedPrecondition) {
			t.Fatalf("settle with FAILED_PRECONDITION: %v, %v", resp, err)
		}

		// A store that refuses a status by a rule of its own is answered
		// the same way, naming its rule.
		strict := &fakeStore{now: epoch, err: fmt.Errorf("%w: this store keeps no status message", store.ErrInvalidStatus)}
		c = w.serve(t, strict, allowAll)
		_, err = c.SettleKey(t.Context(), &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "held",
			Status: &spb.Status{Code: int32(codes.FailedPrecondition), Message: "cancelled by an operator"}})
		if msg := wantCode(t, err, codes.InvalidArgument); !strings.Contains(msg, "this store keeps no status message") {
			t.Errorf("settle refused by the store: %q, want its rule named", msg)
		}
	})
}

func TestLeaseLive(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		until := epoch.Add(90*time.Second + 250*time.Millisecond)
		held := info("acme", doMethod, "held", store.InProgress, epoch)
		held.LeaseUntil = until
		held2 := held
		held2.Scope.Key = "held2"
		done := info("acme", doMethod, "done", store.Recorded, epoch)
		done.Outcome = recorded(t, code.Code_OK, &testv1.DoResponse{Value: "x"})
		st := &fakeStore{now: epoch, keys: []store.KeyInfo{held, held2, done}}
		c := w.serve(t, st, allowAll)
		ctx := t.Context()

		wantUntil := "2026-12-01T10:01:30.25Z"
		_, err := c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: "held"})
		if msg := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(msg, wantUntil) {
			t.Errorf("forget: %q does not name the lease's expiry %s", msg, wantUntil)
		}
		settle := &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "held2",
			Status: &spb.Status{Code: int32(codes.FailedPrecondition), Message: "settled by an operator"}}
		_, err = c.SettleKey(ctx, settle)
		if msg := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(msg, wantUntil) {
			t.Errorf("settle: %q does not name the lease's expiry %s", msg, wantUntil)
		}

		if _, err := c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: "held", Force: true, Reason: "stuck"}); err != nil {
			t.Fatalf("forced forget: %v", err)
		}
		settle.Force, settle.Reason = true, "stuck"
		resp, err := c.SettleKey(ctx, settle)
		if err != nil {
			t.Fatalf("forced settle: %v", err)
		}
		k := resp.GetKey()
		if k.GetState() != adminv1.KeyState_KEY_STATE_RECORDED || k.GetOutcome().GetCode() != int32(codes.FailedPrecondition) ||
			k.GetOutcome().GetError().GetMessage() != "settled by an operator" {
			t.Errorf("settled key: %v", k)
		}
		// The settled body is one a replay reads.
		st.mu.Lock()
		r, err := record.Decode(st.keys[0].Outcome.Body)
		st.mu.Unlock()
		if err != nil || r.Code != code.Code_FAILED_PRECONDITION {
			t.Errorf("settled body: %v, %v", r, err)
		}

		_, err = c.SettleKey(ctx, &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "done",
			Status: &spb.Status{Code: int32(codes.FailedPrecondition)}, Force: true, Reason: "stuck"})
		wantCode(t, err, codes.FailedPrecondition)
	})
}

func TestPaging(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		st := &fakeStore{}
		for i, k := range []string{"a", "b", "c", "d", "e"} {
			st.keys = append(st.keys, info("acme", doMethod, k, store.Recorded, epoch.Add(time.Duration(i)*time.Second)))
		}
		st.keys = append(st.keys, info("acme", "/other.v1.S/M", "z", store.Recorded, epoch))
		key := bytes.Repeat([]byte{7}, 32)
		c := w.serve(t, st, allowAll, admin.WithPageTokenKey(key))
		ctx := t.Context()

		req := &adminv1.ListKeysRequest{Tenant: "acme", Method: doMethod, PageSize: 2,
			States: []adminv1.KeyState{adminv1.KeyState_KEY_STATE_RECORDED, adminv1.KeyState_KEY_STATE_ABANDONED}}
		var got []string
		var tokens []string
		for page := 0; ; page++ {
			if page > 5 {
				t.Fatal("paging does not end")
			}
			resp, err := c.ListKeys(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range resp.GetKeys() {
				got = append(got, k.GetKey())
			}
			if resp.GetNextPageToken() == "" {
				break
			}
			tokens = append(tokens, resp.GetNextPageToken())
			req.PageToken = resp.GetNextPageToken()
			// The states' order selects nothing: the token still holds.
			req.States[0], req.States[1] = req.States[1], req.States[0]
		}
		st.mu.Lock()
		last := st.last
		st.mu.Unlock()
		if last.Tenant != "acme" || last.AllTenants || last.Method != doMethod || len(last.States) != 2 || last.Limit != 2 {
			t.Errorf("the store was asked %+v", last)
		}
		if strings.Join(got, ",") != "a,b,c,d,e" {
			t.Errorf("pages gave %v, want a to e", got)
		}
		if len(tokens) != 2 {
			t.Fatalf("got %d page tokens, want 2", len(tokens))
		}
		tok := tokens[0]

		// Another server with the same key accepts the token (another
		// replica); one with its own random key does not.
		other := w.serve(t, st, allowAll, admin.WithPageTokenKey(key))
		base := &adminv1.ListKeysRequest{Tenant: "acme", Method: doMethod, PageSize: 2, PageToken: tok,
			States: []adminv1.KeyState{adminv1.KeyState_KEY_STATE_RECORDED, adminv1.KeyState_KEY_STATE_ABANDONED}}
		if resp, err := other.ListKeys(ctx, base); err != nil || resp.GetKeys()[0].GetKey() != "c" {
			t.Errorf("a replica with the same key: %v, %v", resp, err)
		}
		_, err := w.serve(t, st, allowAll).ListKeys(ctx, base)
		wantCode(t, err, codes.InvalidArgument)

		calls := st.storeCalls()
		for name, mutate := range map[string]func(r *adminv1.ListKeysRequest){
			"other method":  func(r *adminv1.ListKeysRequest) { r.Method = "/other.v1.S/M" },
			"other tenant":  func(r *adminv1.ListKeysRequest) { r.Tenant = "acme2" },
			"every tenant":  func(r *adminv1.ListKeysRequest) { r.Tenant, r.AllTenants = "", true },
			"other states":  func(r *adminv1.ListKeysRequest) { r.States = r.States[:1] },
			"created after": func(r *adminv1.ListKeysRequest) { r.CreatedAfter = timestamp(epoch) },
			"flipped byte": func(r *adminv1.ListKeysRequest) {
				b := []byte(r.PageToken)
				b[len(b)/2] ^= 1
				r.PageToken = string(b)
			},
			"longer cursor": func(r *adminv1.ListKeysRequest) { r.PageToken += "AA" },
			"not base64":    func(r *adminv1.ListKeysRequest) { r.PageToken = "!!" },
		} {
			r := proto.CloneOf(base)
			mutate(r)
			_, err := c.ListKeys(ctx, r)
			if got, msg := codeOf(err); got != codes.InvalidArgument {
				t.Errorf("%s: got %v (%q), want InvalidArgument", name, got, msg)
			}
		}
		if n := st.storeCalls(); n != calls {
			t.Errorf("refused page tokens reached the store %d times", n-calls)
		}
		// A page's size may change from page to page.
		r := proto.CloneOf(base)
		r.PageSize = 10
		if resp, err := c.ListKeys(ctx, r); err != nil || len(resp.GetKeys()) != 3 {
			t.Errorf("another page size: %v, %v", resp, err)
		}
	})
}

func TestOutcomeDecoded(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		ok := info("acme", doMethod, "ok", store.Recorded, epoch)
		ok.Outcome = recorded(t, code.Code_OK, &testv1.DoResponse{Value: "paid", Execution: 3, Labels: map[string]string{"a": "b"}})
		ok.Replays, ok.LastReplay = 7, epoch.Add(time.Hour)
		scoped := info("acme", "idem.test.Do", "scoped", store.Recorded, epoch)
		scoped.Outcome = recorded(t, code.Code_OK, &testv1.DoResponse{Value: "renamed"})
		unknown := info("acme", "/nowhere.v1.S/M", "unknown", store.Recorded, epoch)
		unknown.Outcome = recorded(t, code.Code_OK, &testv1.DoResponse{Value: "raw"})
		failed := info("acme", doMethod, "failed", store.Recorded, epoch)
		failed.Outcome = recorded(t, code.Code_NOT_FOUND, &spb.Status{Code: int32(codes.NotFound), Message: "no such payment"})
		leased := info("acme", doMethod, "leased", store.Abandoned, epoch)
		leased.LeaseUntil = epoch.Add(time.Minute)
		leased.Takeovers = 2
		leased.Steps = []store.Step{{Name: "charge", Result: []byte("ch_1")}}
		leased.Call = &store.Call{}
		st := &fakeStore{keys: []store.KeyInfo{ok, scoped, unknown, failed, leased}}
		c := w.serve(t, st, allowAll)
		get := func(ki store.KeyInfo) *adminv1.Key {
			t.Helper()
			resp, err := c.GetKey(t.Context(), &adminv1.GetKeyRequest{Tenant: ki.Scope.Tenant, Method: ki.Scope.Method, Key: ki.Scope.Key})
			if err != nil {
				t.Fatal(err)
			}
			return resp.GetKey()
		}

		k := get(ok)
		fields := k.GetOutcome().GetResponse().GetStructValue().GetFields()
		if fields["value"].GetStringValue() != "paid" || fields["execution"].GetStringValue() != "3" ||
			fields["labels"].GetStructValue().GetFields()["a"].GetStringValue() != "b" {
			t.Errorf("decoded response: %v", k.GetOutcome())
		}
		if k.GetOutcome().GetResponseType() != "idem.test.v1.DoResponse" || k.GetState() != adminv1.KeyState_KEY_STATE_RECORDED ||
			!bytes.Equal(k.GetFingerprint(), []byte{0xfe, 0xed}) || !k.GetCreateTime().AsTime().Equal(epoch) {
			t.Errorf("key: %v", k)
		}
		if k.GetReplays() != 7 || !k.GetLastReplayTime().AsTime().Equal(epoch.Add(time.Hour)) {
			t.Errorf("replays: %d, the last at %v; want 7, at %v", k.GetReplays(), k.GetLastReplayTime(), epoch.Add(time.Hour))
		}
		if v := get(scoped).GetOutcome().GetResponse().GetStructValue().GetFields()["value"].GetStringValue(); v != "renamed" {
			t.Errorf("a key under a scope name: value %q", v)
		}
		out := get(unknown).GetOutcome()
		want, _ := proto.Marshal(&testv1.DoResponse{Value: "raw"})
		if !bytes.Equal(out.GetRawResponse(), want) || !strings.Contains(out.GetNote(), "does not know") {
			t.Errorf("unknown method's outcome: %v", out)
		}
		if e := get(failed).GetOutcome().GetError(); e.GetCode() != int32(codes.NotFound) || e.GetMessage() != "no such payment" {
			t.Errorf("recorded error: %v", e)
		}
		k = get(leased)
		if k.GetTakeovers() != 2 || k.GetSteps()[0].GetName() != "charge" || string(k.GetSteps()[0].GetResult()) != "ch_1" ||
			!k.GetFinishable() || !k.GetLeaseExpireTime().AsTime().Equal(epoch.Add(time.Minute)) || k.GetOutcome() != nil ||
			k.GetReplays() != 0 || k.GetLastReplayTime() != nil {
			t.Errorf("leased key: %v", k)
		}
	})
}

// TestStoreErrorHidden: a store's error, which may hold SQL, reaches the
// log, never the client.
func TestStoreErrorHidden(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		st := &fakeStore{err: errors.New(`ERROR: canceling statement (SQLSTATE 57014) in SELECT state FROM idempotency_keys WHERE tenant = $1`)}
		var logs lockedBuffer
		c := w.serve(t, st, allowAll, admin.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		ctx := t.Context()
		for name, call := range map[string]func() error{
			"get": func() error {
				_, err := c.GetKey(ctx, &adminv1.GetKeyRequest{Tenant: "acme", Method: doMethod, Key: "k"})
				return err
			},
			"list": func() error { _, err := c.ListKeys(ctx, &adminv1.ListKeysRequest{AllTenants: true}); return err },
			"forget": func() error {
				_, err := c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: "k"})
				return err
			},
			"settle": func() error {
				_, err := c.SettleKey(ctx, &adminv1.SettleKeyRequest{Tenant: "acme", Method: doMethod, Key: "k", Status: &spb.Status{Code: 9}})
				return err
			},
		} {
			msg := wantCode(t, call(), codes.Unavailable)
			for _, leak := range []string{"SELECT", "SQLSTATE", "idempotency_keys"} {
				if strings.Contains(msg, leak) {
					t.Errorf("%s: the client saw %q", name, msg)
				}
			}
		}
		if !strings.Contains(logs.String(), "SELECT state FROM idempotency_keys") {
			t.Errorf("the store's error was not logged: %s", logs.String())
		}
	})
}

func TestNewServerNeedsAuthorizer(t *testing.T) {
	for name, f := range map[string]func(){
		"authorizer": func() { admin.NewServer(&fakeStore{}, nil) },
		"store":      func() { admin.NewServer(nil, allowAll) },
		"token key":  func() { admin.NewServer(&fakeStore{}, allowAll, admin.WithPageTokenKey([]byte("short"))) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewServer without a good %s did not panic", name)
				}
			}()
			f()
		}()
	}
}

// spans records the spans started through it; the SDK is not idem's
// module's to require.
type spans struct {
	noop.TracerProvider
	mu    sync.Mutex
	ended []*span
}

func (p *spans) Tracer(string, ...trace.TracerOption) trace.Tracer { return tracer{p: p} }

type tracer struct {
	noop.Tracer
	p *spans
}

func (tr tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	s := &span{p: tr.p, name: name, attrs: cfg.Attributes()}
	return trace.ContextWithSpan(ctx, s), s
}

type span struct {
	noop.Span
	p     *spans
	name  string
	attrs []attribute.KeyValue
	err   bool
}

func (s *span) SetAttributes(kv ...attribute.KeyValue) { s.attrs = append(s.attrs, kv...) }
func (s *span) SetStatus(c otelcodes.Code, _ string)   { s.err = c == otelcodes.Error }
func (s *span) End(...trace.SpanEndOption) {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	s.p.ended = append(s.p.ended, s)
}

func (s *span) attr(k string) attribute.Value {
	for _, kv := range s.attrs {
		if string(kv.Key) == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func TestSpansAndLogs(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		held := info("acme", doMethod, "held", store.InProgress, epoch)
		held.LeaseUntil = epoch.Add(time.Hour)
		st := &fakeStore{now: epoch, keys: []store.KeyInfo{held}}
		tp := &spans{}
		var logs lockedBuffer
		c := w.serve(t, st, admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
			return admin.Grant{Subject: "alice@ops", Tenants: []string{"acme"}}, nil
		}), admin.WithTracerProvider(tp), admin.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		ctx := t.Context()

		_, err := c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: "held"})
		wantCode(t, err, codes.FailedPrecondition)
		if _, err := c.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: "acme", Method: doMethod, Key: "held", Force: true, Reason: "stuck"}); err != nil {
			t.Fatal(err)
		}

		tp.mu.Lock()
		defer tp.mu.Unlock()
		if len(tp.ended) != 2 {
			t.Fatalf("ended %d spans, want 2", len(tp.ended))
		}
		for i, s := range tp.ended {
			if s.name != "idem.admin.ForgetKey" || s.attr("idem.admin.subject").AsString() != "alice@ops" ||
				s.attr("rpc.method").AsString() != "idem.admin.v1.AdminService/ForgetKey" {
				t.Errorf("span %d: %s %v", i, s.name, s.attrs)
			}
		}
		if !tp.ended[0].err || tp.ended[0].attr("rpc.grpc.status_code").AsInt64() != int64(codes.FailedPrecondition) || tp.ended[1].err {
			t.Errorf("spans' status: %v, %v", tp.ended[0].attrs, tp.ended[1].attrs)
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("logged %d lines, want 2:\n%s", len(lines), logs.String())
		}
		for i, want := range []string{`"code":"FAILED_PRECONDITION"`, `"force":true`} {
			for _, w := range []string{`"level":"INFO"`, `"subject":"alice@ops"`, `"rpc":"/idem.admin.v1.AdminService/ForgetKey"`,
				`"tenant":"acme"`, `"key":"held"`, want} {
				if !strings.Contains(lines[i], w) {
					t.Errorf("line %d lacks %s: %s", i, w, lines[i])
				}
			}
		}
	})
}

func timestamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// recordedWithRequest is recorded, keeping req with the outcome as
// idem.MethodPolicy.KeepRequest does.
func recordedWithRequest(t *testing.T, c code.Code, msg, req proto.Message) *store.Outcome {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _, err := record.EncodeRequest(c, msg, nil, nil, b)
	if err != nil {
		t.Fatal(err)
	}
	return &store.Outcome{Code: c, Body: body}
}

// TestRequestShown: a key shows the request recorded with its outcome
// (KeepRequest), or the one kept for a finisher while its call is in
// progress, decoded with its method's request type; raw with a note when
// the server does not know the method or cannot decode it; and none when
// none was kept.
func TestRequestShown(t *testing.T) {
	onEachWire(t, func(t *testing.T, w wire) {
		kept := info("acme", doMethod, "kept", store.Recorded, epoch)
		kept.Outcome = recordedWithRequest(t, code.Code_OK, &testv1.DoResponse{Value: "paid"}, &testv1.DoRequest{Value: "pay"})
		failed := info("acme", doMethod, "failed", store.Recorded, epoch)
		failed.Outcome = recordedWithRequest(t, code.Code_NOT_FOUND, &spb.Status{Code: int32(codes.NotFound)}, &testv1.DoRequest{Value: "gone"})
		none := info("acme", doMethod, "none", store.Recorded, epoch)
		none.Outcome = recorded(t, code.Code_OK, &testv1.DoResponse{Value: "paid"})
		finishable := info("acme", doMethod, "finishable", store.Abandoned, epoch)
		charge, _ := proto.Marshal(&testv1.DoRequest{Value: "charge"})
		finishable.Call = &store.Call{Method: doMethod, Request: charge}
		unknown := info("acme", "/nowhere.v1.S/M", "unknown", store.Recorded, epoch)
		unknown.Outcome = recordedWithRequest(t, code.Code_OK, &testv1.DoResponse{Value: "raw"}, &testv1.DoRequest{Value: "raw"})
		garbled := info("acme", doMethod, "garbled", store.Abandoned, epoch)
		garbled.Call = &store.Call{Method: doMethod, Request: []byte{0xff}}
		var logs lockedBuffer
		c := w.serve(t, &fakeStore{keys: []store.KeyInfo{kept, failed, none, finishable, unknown, garbled}}, allowAll,
			admin.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		get := func(ki store.KeyInfo) *adminv1.Request {
			t.Helper()
			resp, err := c.GetKey(t.Context(), &adminv1.GetKeyRequest{Tenant: ki.Scope.Tenant, Method: ki.Scope.Method, Key: ki.Scope.Key})
			if err != nil {
				t.Fatal(err)
			}
			return resp.GetKey().GetRequest()
		}
		for ki, value := range map[*store.KeyInfo]string{&kept: "pay", &failed: "gone", &finishable: "charge"} {
			r := get(*ki)
			if v := r.GetDecoded().GetStructValue().GetFields()["value"].GetStringValue(); v != value || r.GetRequestType() != "idem.test.v1.DoRequest" || r.GetNote() != "" {
				t.Errorf("%s: request %v, want a DoRequest of value %q", ki.Scope.Key, r, value)
			}
		}
		if r := get(none); r != nil {
			t.Errorf("a key that kept no request shows %v", r)
		}
		want, _ := proto.Marshal(&testv1.DoRequest{Value: "raw"})
		if r := get(unknown); !bytes.Equal(r.GetRaw(), want) || r.GetRequestType() != "" || !strings.Contains(r.GetNote(), "does not know") {
			t.Errorf("unknown method's request: %v", r)
		}
		if r := get(garbled); !bytes.Equal(r.GetRaw(), []byte{0xff}) || !strings.Contains(r.GetNote(), "cannot be decoded") {
			t.Errorf("an undecodable request: %v", r)
		}
		if !strings.Contains(logs.String(), "a kept request cannot be decoded") {
			t.Errorf("the log does not say the request could not be decoded:\n%s", logs.String())
		}
	})
}
