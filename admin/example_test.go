package admin_test

import (
	"context"
	"crypto/tls"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/admin"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemconnect"
	"github.com/idemkit/idem/store"
)

// operators are the operators' certificates' common names, and what each
// may do.
var operators = map[string]admin.Grant{
	"oncall":    {Subject: "oncall", AllTenants: true},
	"acme-help": {Subject: "acme-help", Tenants: []string{"acme"}},
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
