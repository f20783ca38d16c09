package admin_test

import (
	"context"
	"log"
	"log/slog"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/admin"
	"github.com/idemkit/idem/store"
)

// Serve the admin service on the operators' listener, next to grpc-go's
// health and reflection services, with an authorizer that reads the
// operator from the client certificate the TLS handshake verified.
func Example() {
	var st store.Admin = openStore() // postgres.New(pool), say
	operators := map[string]admin.Scope{
		"oncall":    {Subject: "oncall", AllTenants: true},
		"acme-help": {Subject: "acme-help", Tenants: []string{"acme"}},
	}
	authorize := admin.AuthorizerFunc(func(ctx context.Context, r admin.Request) (admin.Scope, error) {
		p, ok := peer.FromContext(ctx)
		tlsInfo, isTLS := p.AuthInfo.(credentials.TLSInfo)
		if !ok || !isTLS || len(tlsInfo.State.VerifiedChains) == 0 {
			return admin.Scope{}, status.Error(codes.Unauthenticated, "dial with an operator's certificate")
		}
		scope, ok := operators[tlsInfo.State.VerifiedChains[0][0].Subject.CommonName]
		if !ok {
			return admin.Scope{}, status.Error(codes.PermissionDenied, "not an operator")
		}
		return scope, nil
	})

	s := grpc.NewServer(grpc.Creds(operatorsTLS()))
	healthgrpc.RegisterHealthServer(s, health.NewServer())
	reflection.Register(s)
	admin.Register(s, admin.NewServer(st, authorize,
		admin.WithPageTokenKey([]byte(os.Getenv("ADMIN_PAGE_TOKEN_KEY"))), // the same 32 bytes or more on every replica
		admin.WithLogger(slog.Default())))

	lis, err := net.Listen("tcp", "127.0.0.1:9091")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(s.Serve(lis))
}

func openStore() store.Admin                         { return nil }
func operatorsTLS() credentials.TransportCredentials { return nil }
