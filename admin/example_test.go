package admin_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/admin"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemconnect"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// operators are the operators' certificates' common names, and what each
// may do.
var operators = map[string]admin.Grant{
	"oncall":    {Subject: "oncall", AllTenants: true},
	"acme-help": {Subject: "acme-help", Tenants: []string{"acme"}},
	"auditor":   {Subject: "auditor", AllTenants: true, ReadOnly: true}, // lists, counts, reads the audit trail
}

// operatorCertificate names the operator from the client certificate the
// TLS handshake verified: it reads the admin.Request, not the wire, so it
// serves gRPC and Connect alike.
var operatorCertificate = admin.AuthorizerFunc(func(_ context.Context, r admin.Request) (admin.Grant, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		return admin.Grant{}, idem.NewError(code.Code_UNAUTHENTICATED, "dial with an operator's certificate")
	}
	scope, ok := operators[r.TLS.VerifiedChains[0][0].Subject.CommonName]
	if !ok {
		return admin.Grant{}, idem.NewError(code.Code_PERMISSION_DENIED, "not an operator")
	}
	return scope, nil
})

// Serve the admin service over gRPC on the operators' listener, next to
// grpc-go's health and reflection services, behind the operators'
// certificates.
func Example() {
	var st store.Admin = openStore() // postgres.New(pool), say
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(operatorsTLS())))
	healthgrpc.RegisterHealthServer(s, health.NewServer())
	reflection.Register(s)
	interceptor.RegisterAdmin(s, admin.NewServer(st, operatorCertificate,
		admin.WithPageTokenKey([]byte(os.Getenv("ADMIN_PAGE_TOKEN_KEY"))), // the same 32 bytes or more on every replica
		admin.WithLogger(slog.Default())))

	lis, err := net.Listen("tcp", "127.0.0.1:9091")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(s.Serve(lis))
}

// Serve the admin service over Connect (and gRPC and gRPC-Web) on the
// operators' listener, with the same authorizer: a Connect program so
// builds no package of grpc-go. idem's command calls it with -protocol
// connect; curl, with JSON:
//
//	curl --cert op.crt --key op.key -H 'Content-Type: application/json' -d '{"tenant": "acme"}' \
//	    https://admin.internal:9091/idem.admin.v1.AdminService/ListKeys
func Example_connect() {
	var st store.Admin = openStore() // postgres.New(pool), say
	mux := http.NewServeMux()
	mux.Handle(idemconnect.NewAdminHandler(admin.NewServer(st, operatorCertificate,
		admin.WithPageTokenKey([]byte(os.Getenv("ADMIN_PAGE_TOKEN_KEY"))),
		admin.WithLogger(slog.Default()))))

	hs := &http.Server{Addr: "127.0.0.1:9091", Handler: mux, TLSConfig: operatorsTLS()}
	log.Fatal(hs.ListenAndServeTLS("", ""))
}

// Call the service in-process, as a console or a script in the server's
// own program would: a Server's methods are its RPCs. An operator with a
// read-only grant counts the stuck keys, and is refused a forget; an
// operator who acts gives a reason, which the audit trail keeps.
func Example_inProcess() {
	ctx := context.Background()
	st := memory.New()
	if _, err := st.ClaimLeased(ctx, store.Scope{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-7"},
		store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Hour}); err != nil {
		log.Fatal(err)
	}
	grant := func(g admin.Grant) admin.Authorizer {
		return admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) { return g, nil })
	}
	quiet := admin.WithLogger(slog.New(slog.DiscardHandler))
	auditor := admin.NewServer(st, grant(operators["auditor"]), quiet)
	oncall := admin.NewServer(st, grant(operators["oncall"]), quiet)

	stats, _ := auditor.GetKeyStats(ctx, &adminv1.GetKeyStatsRequest{Tenant: "acme",
		States: []adminv1.KeyState{adminv1.KeyState_KEY_STATE_IN_PROGRESS, adminv1.KeyState_KEY_STATE_ABANDONED}})
	for _, n := range stats.GetCounts() {
		fmt.Println(n.GetMethod(), n.GetState(), n.GetCount())
	}
	forget := &adminv1.ForgetKeyRequest{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-7",
		Force: true, Reason: "the handler loops; INC-7"}
	_, err := auditor.ForgetKey(ctx, forget)
	fmt.Println(err)
	if _, err := oncall.ForgetKey(ctx, forget); err != nil {
		log.Fatal(err)
	}
	hist, _ := auditor.ListAudit(ctx, &adminv1.ListAuditRequest{Tenant: "acme", Method: forget.Method, Key: forget.Key})
	for _, e := range hist.GetEntries() {
		fmt.Println(e.GetOperator(), e.GetAction(), e.GetStateBefore(), e.GetForce(), e.GetReason())
	}
	// Output:
	// /shop.v1.Shop/Checkout KEY_STATE_IN_PROGRESS 1
	// PERMISSION_DENIED: idem admin: the operator's grant is read-only: it lists and reads keys, never acts on them
	// oncall AUDIT_ACTION_FORGET KEY_STATE_IN_PROGRESS true the handler loops; INC-7
}

func openStore() store.Admin { return nil }

// operatorsTLS is the server's certificate, and the operators' CA, which
// verifies the client certificates it asks for (ClientAuth:
// tls.VerifyClientCertIfGiven, ClientCAs).
func operatorsTLS() *tls.Config { return nil }

// Serve the console in the browser next to the admin service over
// Connect, on the operators' listener, behind the same authorizer: the
// operators' browsers present their client certificates.
func ExampleNewConsole() {
	srv := admin.NewServer(openStore(), operatorCertificate)
	mux := http.NewServeMux()
	mux.Handle(idemconnect.NewAdminHandler(srv))
	mux.Handle("/console/", http.StripPrefix("/console", admin.NewConsole(srv)))
	hs := &http.Server{Addr: "127.0.0.1:9092", Handler: mux, TLSConfig: operatorsTLS()}
	log.Fatal(hs.ListenAndServeTLS("", ""))
}
