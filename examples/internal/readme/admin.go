package readme

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/admin"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemconnect"
	"github.com/idemkit/idem/store/postgres"
)

// serveAdmin serves the admin service of docs/operations.md over gRPC and
// over Connect, behind one authorizer; both servers verify client
// certificates against the operators' CA.
func serveAdmin(pool *pgxpool.Pool, grpcServer *grpc.Server, mux *http.ServeMux) {
	authorize := admin.AuthorizerFunc(func(ctx context.Context, r admin.Request) (admin.Grant, error) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 { // the client certificate, over gRPC or Connect
			return admin.Grant{}, idem.NewError(code.Code_UNAUTHENTICATED, "dial with an operator's certificate")
		}
		return admin.Grant{Subject: r.TLS.VerifiedChains[0][0].Subject.CommonName, AllTenants: true}, nil
	})
	srv := admin.NewServer(postgres.New(pool), authorize)
	interceptor.RegisterAdmin(grpcServer, srv)   // gRPC
	mux.Handle(idemconnect.NewAdminHandler(srv)) // Connect, gRPC and gRPC-Web; no grpc-go in a Connect program
}
