package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem/admin"
	"github.com/idemkit/idem/gen/idem/admin/v1/adminv1connect"
	"github.com/idemkit/idem/internal/admingrpc"
	"github.com/idemkit/idem/store/postgres"
)

// connection is where the command's calls go, and how its answers are
// printed: the flags every subcommand takes.
type connection struct {
	addr          string
	protocol      string
	databaseURL   string
	insecure      bool
	ca            string
	serverName    string
	cert, certKey string
	headers       headerFlag
	timeout       time.Duration
	output        string
}

func (c *connection) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", os.Getenv("IDEM_ADMIN_ADDR"), "the admin service's `host:port` (default $IDEM_ADMIN_ADDR)")
	fs.StringVar(&c.protocol, "protocol", "grpc", "the `protocol` of -addr: grpc, or connect (a Connect handler, such as idemconnect.NewAdminHandler's, over HTTP)")
	fs.StringVar(&c.databaseURL, "database-url", "", "act on the PostgreSQL database at this `url` directly, without a server or an authorizer: its credentials are the authority")
	fs.BoolVar(&c.insecure, "insecure", false, "dial -addr in plaintext; loopback addresses only")
	fs.StringVar(&c.ca, "ca", "", "verify the server against the CA certificates in this PEM `file` (default the system's roots)")
	fs.StringVar(&c.serverName, "server-name", "", "verify the server's certificate for this `name` (default -addr's host)")
	fs.StringVar(&c.cert, "cert", "", "present the client certificate in this PEM `file` (with -cert-key)")
	fs.StringVar(&c.certKey, "cert-key", "", "the client certificate's private key, a PEM `file` (with -cert)")
	fs.Var(&c.headers, "H", "add the metadata entry `'name: value'` to every call, such as -H 'authorization: Bearer …' (repeatable)")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "bound each call by this `duration`")
	fs.StringVar(&c.output, "o", "table", "print a `table` or json (the service's answer as protobuf JSON)")
}

func (c *connection) json() bool { return c.output == "json" }

// check checks the connection flags.
func (c *connection) check(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.databaseURL != "" && !set["addr"] {
		c.addr = "" // $IDEM_ADMIN_ADDR gives way to an explicit -database-url
	}
	switch {
	case c.output != "table" && c.output != "json":
		return usagef("-o is table or json, not %q", c.output)
	case c.timeout <= 0:
		return usagef("-timeout must be positive")
	case c.protocol != "grpc" && c.protocol != "connect":
		return usagef("-protocol is grpc or connect, not %q", c.protocol)
	case c.addr == "" && c.databaseURL == "":
		return usagef("give -addr (or $IDEM_ADMIN_ADDR) or -database-url")
	case c.addr != "" && c.databaseURL != "":
		return usagef("give -addr or -database-url, not both")
	case c.databaseURL != "":
		for _, name := range []string{"protocol", "insecure", "ca", "server-name", "cert", "cert-key", "H"} {
			if set[name] {
				return usagef("-%s applies to -addr, not to -database-url", name)
			}
		}
		return nil
	case (c.cert == "") != (c.certKey == ""):
		return usagef("-cert and -cert-key go together")
	case c.insecure && (c.ca != "" || c.cert != "" || c.serverName != ""):
		return usagef("-insecure dials without TLS: drop -ca, -server-name, -cert and -cert-key, or -insecure")
	}
	host, _, err := net.SplitHostPort(c.addr)
	if err != nil {
		return usagef("-addr %q is not host:port: %v", c.addr, err)
	}
	if c.insecure && !loopback(host) {
		return usagef("-insecure sends calls (and any -H token) in plaintext, so it dials loopback addresses only, not %q; use TLS, or a tunnel to a local port", host)
	}
	return nil
}

// loopback reports whether host names this machine's loopback interface.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// do connects, and calls f with a client of the admin service and the
// context to call it with.
func (c *connection) do(ctx context.Context, stderr io.Writer, f func(context.Context, adminv1connect.AdminServiceClient) error) error {
	if c.databaseURL != "" {
		srv, stop, err := direct(ctx, c.databaseURL, stderr)
		if err != nil {
			return err
		}
		defer stop()
		return f(ctx, srv)
	}
	cfg, err := c.tlsConfig()
	if err != nil {
		return err
	}
	if c.protocol == "connect" {
		return f(ctx, c.connectClient(cfg))
	}
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	if len(c.headers) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, c.headers...)
	}
	return f(ctx, admingrpc.NewClient(conn))
}

// tlsConfig returns the TLS configuration of -addr; nil with -insecure.
func (c *connection) tlsConfig() (*tls.Config, error) {
	if c.insecure {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.serverName}
	if c.ca != "" {
		pem, err := os.ReadFile(c.ca)
		if err != nil {
			return nil, fmt.Errorf("-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-ca: %s holds no PEM certificate", c.ca)
		}
	}
	if c.cert != "" {
		cert, err := tls.LoadX509KeyPair(c.cert, c.certKey)
		if err != nil {
			return nil, fmt.Errorf("-cert and -cert-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// connectClient returns a client of the Connect handler at -addr: HTTPS
// with cfg, HTTP without, each call with the -H headers.
func (c *connection) connectClient(cfg *tls.Config) adminv1connect.AdminServiceClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	scheme := "http"
	if cfg != nil {
		tr.TLSClientConfig, scheme = cfg, "https"
	}
	headers := c.headers
	addHeaders := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			for i := 0; i+1 < len(headers); i += 2 {
				name, value := headers[i], headers[i+1]
				if strings.HasSuffix(name, "-bin") {
					value = connect.EncodeBinaryHeader([]byte(value)) // as grpc-go sends it
				}
				req.Header().Add(name, value)
			}
			return next(ctx, req)
		}
	})
	return adminv1connect.NewAdminServiceClient(&http.Client{Transport: tr}, scheme+"://"+c.addr,
		connect.WithInterceptors(addHeaders))
}

// directTokenKey signs the page tokens of -database-url. It is fixed, not
// secret, so that a token one run prints is accepted by the next: the
// signature keeps a token to the filter it was listed with, and whoever
// runs the command holds the database's credentials, so a forged token
// would reach nothing they could not read already.
var directTokenKey = sha256.Sum256([]byte("idem keys -database-url page tokens"))

// allowDatabaseUser is the authorizer of -database-url: the database's
// credentials are the authority, over every tenant.
var allowDatabaseUser = admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
	return admin.Grant{Subject: "database user", AllTenants: true}, nil
})

// direct returns the admin service over the PostgreSQL store at url, run
// in this process: the command calls its methods as a server's adapter
// does, so that both modes make the same calls and print the same answers.
// Its log lines of WARN and above (a store's failure, with the database's
// error) go to stderr. stop closes the pool.
func direct(ctx context.Context, url string, stderr io.Writer) (srv *admin.Server, stop func(), err error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, usagef("-database-url: %v", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("-database-url: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv = admin.NewServer(postgres.New(pool), allowDatabaseUser,
		admin.WithPageTokenKey(directTokenKey[:]), admin.WithLogger(logger))
	return srv, pool.Close, nil
}

// headerFlag is -H: metadata entries, as pairs for
// metadata.AppendToOutgoingContext.
type headerFlag []string

func (h *headerFlag) String() string { return strings.Join(*h, " ") }

func (h *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.ToLower(strings.TrimSpace(name))
	if !ok || name == "" {
		return errors.New("want 'name: value'")
	}
	*h = append(*h, name, strings.TrimSpace(value))
	return nil
}
