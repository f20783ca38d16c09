// Package adminlisten serves idem's admin service for the example servers,
// on a listener of its own, over gRPC, and its console (admin.NewConsole)
// over HTTP, behind a demo authorizer: a fixed operator token in the
// authorization header, which serves a Connect handler of the service
// (idemconnect.NewAdminHandler) alike, and a browser as the password of
// HTTP basic authentication. It is a demo: in production, use mTLS or your
// identity provider (see package admin's example), and never serve the
// admin service or its console on the public listener.
package adminlisten

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/admin"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store"
)

// TokenEnv is the environment variable the examples read the operator
// token from, when their -admin-token flag is not set.
const TokenEnv = "IDEM_ADMIN_TOKEN"

// ErrNoToken refuses to serve the admin service without an operator token:
// there is no default that lets anyone in.
var ErrNoToken = errors.New("the admin listener needs an operator token: set -admin-token or $" + TokenEnv + " (a demo authorizer; use mTLS or your identity provider in production)")

// Config is what the admin listener serves.
type Config struct {
	// Store is the store the service reads and acts on.
	Store store.Admin
	// Token is the operator token callers send as "authorization: Bearer
	// TOKEN"; empty is refused (ErrNoToken).
	Token string
	// Finisher, if not nil, lets FinishKey finish abandoned calls.
	Finisher *idem.Finisher
	// MeterProvider and TracerProvider are the example's, for the admin
	// calls' RPC metrics and spans; nil selects the global ones.
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	// Logger logs the admin calls; nil selects slog.Default.
	Logger *slog.Logger
}

// NewServer returns a gRPC server of the admin service, grpc-go's health
// service and server reflection (so that grpcurl works), instrumented by
// otelgrpc with cfg's providers, or ErrNoToken.
func NewServer(cfg Config) (*grpc.Server, error) {
	if cfg.Token == "" {
		return nil, ErrNoToken
	}
	var otelOpts []otelgrpc.Option
	if cfg.MeterProvider != nil {
		otelOpts = append(otelOpts, otelgrpc.WithMeterProvider(cfg.MeterProvider))
	}
	if cfg.TracerProvider != nil {
		otelOpts = append(otelOpts, otelgrpc.WithTracerProvider(cfg.TracerProvider))
	}
	s := grpc.NewServer(grpc.StatsHandler(otelgrpc.NewServerHandler(otelOpts...)))
	healthpb.RegisterHealthServer(s, health.NewServer())
	reflection.Register(s)
	interceptor.RegisterAdmin(s, newAdmin(cfg))
	return s, nil
}

// newAdmin returns the admin service of cfg, which has a token.
func newAdmin(cfg Config) *admin.Server {
	opts := []admin.Option{admin.WithLogger(cfg.Logger), admin.WithTracerProvider(cfg.TracerProvider)}
	if cfg.Finisher != nil {
		opts = append(opts, admin.WithFinisher(cfg.Finisher))
	}
	return admin.NewServer(cfg.Store, TokenAuthorizer(cfg.Token), opts...)
}

// ConsolePath is the path NewConsole serves the console at.
const ConsolePath = "/console/"

// NewConsole returns an HTTP handler of the admin service's console
// (admin.NewConsole) at ConsolePath, with / redirecting there, behind
// cfg's operator token, or ErrNoToken. A browser signs in with HTTP basic
// authentication, any user name and the token as the password: a request
// that the authorizer answers UNAUTHENTICATED gets a basic challenge, which
// makes the browser ask for them.
func NewConsole(cfg Config) (http.Handler, error) {
	if cfg.Token == "" {
		return nil, ErrNoToken
	}
	mux := http.NewServeMux()
	mux.Handle(ConsolePath, http.StripPrefix(strings.TrimSuffix(ConsolePath, "/"), admin.NewConsole(newAdmin(cfg))))
	mux.Handle("GET /{$}", http.RedirectHandler(ConsolePath, http.StatusFound))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(challenger{w}, r)
	}), nil
}

// challenger adds a basic authentication challenge to a 401 answer.
type challenger struct{ http.ResponseWriter }

func (c challenger) WriteHeader(status int) {
	if status == http.StatusUnauthorized {
		c.Header().Set("WWW-Authenticate", `Basic realm="idem console", charset="UTF-8"`)
	}
	c.ResponseWriter.WriteHeader(status)
}

// Serve serves cfg's admin server on lis until ctx ends, then stops it
// gracefully. It returns ErrNoToken before serving when cfg has no token.
func Serve(ctx context.Context, lis net.Listener, cfg Config) error {
	s, err := NewServer(cfg)
	if err != nil {
		return err
	}
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			s.GracefulStop()
		case <-stopped:
		}
	}()
	err = s.Serve(lis)
	close(stopped)
	return err
}

// TokenAuthorizer is the demo authorizer: a caller that sends
// "authorization: Bearer TOKEN" with the operator token, or a browser that
// sends it as the password of HTTP basic authentication, is the operator,
// allowed every tenant; any other is UNAUTHENTICATED. It reads the
// request's header and answers with an idem.Error, so it serves the admin
// service over gRPC and Connect, and its console, alike.
func TokenAuthorizer(token string) admin.Authorizer {
	return admin.AuthorizerFunc(func(_ context.Context, r admin.Request) (admin.Grant, error) {
		v := r.Header["authorization"]
		if len(v) != 1 {
			return admin.Grant{}, idem.NewError(code.Code_UNAUTHENTICATED, "send the operator token as authorization: Bearer TOKEN")
		}
		got, ok := strings.CutPrefix(v[0], "Bearer ")
		if !ok {
			// A browser's basic authentication: the token is the password.
			_, got, ok = (&http.Request{Header: http.Header{"Authorization": v}}).BasicAuth()
		}
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			return admin.Grant{}, idem.NewError(code.Code_UNAUTHENTICATED, "the operator token is not valid")
		}
		return admin.Grant{Subject: "operator-token", AllTenants: true}, nil
	})
}
