package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/admin"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/interceptor/idemconnect"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/record"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/store/postgres"
)

func TestMain(m *testing.M) {
	// The tests' standard input is no operator's terminal, whatever runs
	// them; TestBulk says when it is.
	isTerminal = func() bool { return false }
	os.Exit(pgtest.Run(m))
}

const (
	checkout = "/shop.v1.Shop/Checkout"
	doMethod = "/idem.test.v1.TestService/Do" // its output type is linked: testv1
)

var (
	leased   = store.Scope{Tenant: "acme", Method: checkout, Key: "order-7"}
	recorded = store.Scope{Tenant: "acme", Method: doMethod, Key: "pay-1"}
)

// protocols are the values of -protocol: the command's tests run against
// a server of each.
var protocols = []string{"grpc", "connect"}

// onEachProtocol runs test, as a subtest, against a fixture served with
// each protocol.
func onEachProtocol(t *testing.T, test func(t *testing.T, f *fixture)) {
	for _, protocol := range protocols {
		t.Run(protocol, func(t *testing.T) { test(t, newFixture(t, protocol)) })
	}
}

// fixture is an admin server over store/memory on 127.0.0.1, served with
// protocol, holding a key leased for a minute (order-7, claimed first) and
// a recorded one (pay-1, a second later).
type fixture struct {
	st       *memory.Store
	addr     string
	protocol string
	mu       sync.Mutex
	now      time.Time
	pending  store.Lease
}

func newFixture(t *testing.T, protocol string) *fixture {
	t.Helper()
	f := &fixture{protocol: protocol, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	f.st = memory.New(memory.WithClock(f.clock))
	all := admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
		return admin.Grant{Subject: "oncall", AllTenants: true}, nil
	})
	f.addr = serve(t, protocol, nil, admin.NewServer(f.st, all, admin.WithLogger(slog.New(slog.DiscardHandler))))
	f.pending = seed(t, f.st, func() { f.advance(time.Second) })
	return f
}

func (f *fixture) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fixture) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// seed claims the leased key, calls between, and records the recorded
// key's response. It returns the lease.
func seed(t *testing.T, st store.Store, between func()) store.Lease {
	t.Helper()
	ctx := t.Context()
	lc, err := st.ClaimLeased(ctx, leased, store.LeaseRequest{Fingerprint: []byte("fp-7"), Lease: time.Minute})
	if err != nil || lc.Lease == nil {
		t.Fatalf("lease %v: %+v, %v", leased, lc, err)
	}
	between()
	c, err := st.Claim(ctx, recorded, store.ClaimRequest{Fingerprint: []byte("fp-1")})
	if err != nil || c.Txn == nil {
		t.Fatalf("claim %v: %+v, %v", recorded, c, err)
	}
	req, err := proto.Marshal(&testv1.DoRequest{Value: "pay"}) // kept, as KeepRequest keeps it
	if err != nil {
		t.Fatal(err)
	}
	body, _, err := record.EncodeRequest(code.Code_OK, &testv1.DoResponse{Value: "paid"}, nil, nil, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Txn.Record(ctx, store.Outcome{Code: code.Code_OK, Body: body}); err != nil {
		t.Fatalf("record %v: %v", recorded, err)
	}
	if rc, ok := st.(store.ReplayCounter); ok { // two retries of the recorded key
		rc.CountReplay(recorded)
		rc.CountReplay(recorded)
		if err := rc.FlushReplays(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return lc.Lease
}

// serve serves srv with protocol (grpc-go's interceptor.RegisterAdmin, or
// connect-go's idemconnect.NewAdminHandler) on a loopback port, over TLS
// with cfg unless it is nil, and returns its address.
func serve(t *testing.T, protocol string, cfg *tls.Config, srv *admin.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	switch protocol {
	case "grpc":
		var opts []grpc.ServerOption
		if cfg != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
		}
		s := grpc.NewServer(opts...)
		interceptor.RegisterAdmin(s, srv)
		go s.Serve(lis)
		t.Cleanup(s.Stop)
	case "connect":
		mux := http.NewServeMux()
		mux.Handle(idemconnect.NewAdminHandler(srv))
		hs := &http.Server{Handler: mux, TLSConfig: cfg}
		if cfg != nil {
			go hs.ServeTLS(lis, "", "")
		} else {
			go hs.Serve(lis)
		}
		t.Cleanup(func() { hs.Close() })
	default:
		t.Fatalf("no protocol %q", protocol)
	}
	return lis.Addr().String()
}

// idem runs the command line args and returns its stdout, stderr and exit
// status.
func idem(t *testing.T, args ...string) (stdout, stderr string, exit int) {
	t.Helper()
	var out, errOut bytes.Buffer
	exit = run(args, &out, &errOut)
	return out.String(), errOut.String(), exit
}

// ok runs args, fails t unless the command succeeds, and returns its
// stdout.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, exit := idem(t, args...)
	if exit != 0 {
		t.Fatalf("idem %q: exit %d, stderr %q", args, exit, errOut)
	}
	return out
}

// fails runs args and fails t unless the command exits 1 with want on
// stderr.
func fails(t *testing.T, want string, args ...string) {
	t.Helper()
	out, errOut, exit := idem(t, args...)
	if exit != 1 || !strings.Contains(errOut, want) {
		t.Fatalf("idem %q: exit %d, stderr %q, stdout %q; want exit 1 and %q on stderr", args, exit, errOut, out, want)
	}
}

func (f *fixture) cmd(args ...string) []string {
	return append(args, "-addr", f.addr, "-insecure", "-protocol", f.protocol)
}

// rows returns the table's rows, split into fields, without its header.
func rows(t *testing.T, table string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
	if want := "KEY TENANT METHOD STATE CREATED EXPIRES LEASE UNTIL TAKEOVERS REPLAYS"; strings.Join(strings.Fields(lines[0]), " ") != want {
		t.Fatalf("table header %q, want %q", lines[0], want)
	}
	var rs [][]string
	for _, l := range lines[1:] {
		rs = append(rs, strings.Fields(l))
	}
	return rs
}

func unmarshal[M proto.Message](t *testing.T, s string, m M) M {
	t.Helper()
	if err := protojson.Unmarshal([]byte(s), m); err != nil {
		t.Fatalf("the output is not a %T: %v\n%s", m, err, s)
	}
	return m
}

func TestListTable(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		got := rows(t, ok(t, f.cmd("keys", "list", "-tenant", "acme")...))
		want := [][]string{
			{"order-7", "acme", checkout, "in_progress", "2026-01-02T03:04:05Z", "2026-01-03T03:04:05Z", "2026-01-02T03:05:05Z", "0", "0"},
			{"pay-1", "acme", doMethod, "recorded", "2026-01-02T03:04:06Z", "2026-01-03T03:04:06Z", "-", "0", "2"},
		}
		if strings.Join(flat(got), " ") != strings.Join(flat(want), " ") {
			t.Fatalf("list:\n%q\nwant\n%q", got, want)
		}

		got = rows(t, ok(t, f.cmd("keys", "list", "-all-tenants", "-state", "recorded,expired", "-method", doMethod)...))
		if len(got) != 1 || got[0][0] != "pay-1" {
			t.Fatalf("list of recorded keys of %s: %q, want pay-1 alone", doMethod, got)
		}
		got = rows(t, ok(t, f.cmd("keys", "list", "-tenant", "acme", "-state", "abandoned", "-state", "in_progress")...))
		if len(got) != 1 || got[0][0] != "order-7" {
			t.Fatalf("list of keys in progress or abandoned: %q, want order-7 alone", got)
		}
		got = rows(t, ok(t, f.cmd("keys", "list", "-tenant", "acme", "-created-after", "2026-01-02T03:04:06Z")...))
		if len(got) != 1 || got[0][0] != "pay-1" {
			t.Fatalf("list of keys created from 03:04:06: %q, want pay-1 alone", got)
		}
		if got = rows(t, ok(t, f.cmd("keys", "list", "-tenant", "other")...)); len(got) != 0 {
			t.Fatalf("list of another tenant: %q, want no rows", got)
		}
	})
}

func flat(rs [][]string) []string {
	var all []string
	for _, r := range rs {
		all = append(all, strings.Join(r, "|"))
	}
	return all
}

func TestListJSON(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		t.Setenv("IDEM_ADMIN_ADDR", f.addr) // instead of -addr
		resp := unmarshal(t, ok(t, "keys", "list", "-insecure", "-protocol", f.protocol, "-tenant", "acme", "-o", "json"), &adminv1.ListKeysResponse{})
		if len(resp.GetKeys()) != 2 || resp.GetNextPageToken() != "" {
			t.Fatalf("list: %v, want two keys and no next page", resp)
		}
		k := resp.GetKeys()[1]
		if k.GetKey() != "pay-1" || k.GetState() != adminv1.KeyState_KEY_STATE_RECORDED ||
			k.GetOutcome().GetResponse().GetStructValue().GetFields()["value"].GetStringValue() != "paid" {
			t.Fatalf("list's second key: %v, want pay-1 recorded with its response", k)
		}
		if k := resp.GetKeys()[0]; k.GetKey() != "order-7" || k.GetState() != adminv1.KeyState_KEY_STATE_IN_PROGRESS || k.GetLeaseExpireTime() == nil {
			t.Fatalf("list's first key: %v, want order-7 in progress under its lease", k)
		}
	})
}

func TestGet(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		out := ok(t, f.cmd("keys", "get", "-tenant", "acme", "-method", doMethod, "pay-1")...)
		for _, want := range []string{`(?m)^key: +pay-1$`, `(?m)^state: +recorded$`, `(?m)^outcome: +OK$`,
			`(?m)^response: +idem\.test\.v1\.DoResponse \{"value":"paid"\}$`, `(?m)^fingerprint: +66702d31$`,
			`(?m)^replays: +2$`, `(?m)^last replay: +2026-01-02T03:04:06Z$`,
			`(?m)^request: +idem\.test\.v1\.DoRequest \{"value":"pay"\}$`} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("get pay-1 printed\n%s\nwant a line matching %s", out, want)
			}
		}
		resp := unmarshal(t, ok(t, f.cmd("keys", "get", "-tenant", "acme", "-method", checkout, "-key", "order-7", "-o", "json")...), &adminv1.GetKeyResponse{})
		if k := resp.GetKey(); k.GetKey() != "order-7" || k.GetState() != adminv1.KeyState_KEY_STATE_IN_PROGRESS || k.GetOutcome() != nil {
			t.Fatalf("get order-7: %v, want it in progress, with no outcome", k)
		}
		fails(t, "NOT_FOUND: ", f.cmd("keys", "get", "-tenant", "acme", "-method", checkout, "order-8")...)
	})
}

func TestForget(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		if out := ok(t, f.cmd("keys", "forget", "-tenant", "acme", "-method", doMethod, "pay-1")...); !strings.Contains(out, `Forgot key "pay-1"`) {
			t.Fatalf("forget printed %q", out)
		}
		fails(t, "NOT_FOUND: ", f.cmd("keys", "get", "-tenant", "acme", "-method", doMethod, "pay-1")...)
		fails(t, "NOT_FOUND: ", f.cmd("keys", "forget", "-tenant", "acme", "-method", doMethod, "pay-1")...)
		c, err := f.st.Claim(t.Context(), recorded, store.ClaimRequest{Fingerprint: []byte("fp-1")})
		if err != nil || c.Txn == nil {
			t.Fatalf("retry of the forgotten key: %+v, %v; want it to run afresh", c, err)
		}
		_ = c.Txn.Release(t.Context())

		fails(t, "FAILED_PRECONDITION: idem admin: the key's lease is live until 2026-01-02T03:05:05Z",
			f.cmd("keys", "forget", "-tenant", "acme", "-method", checkout, "order-7")...)
		if out := ok(t, f.cmd("keys", "forget", "-tenant", "acme", "-method", checkout, "order-7", "-force", "-reason", "stuck", "-o", "json")...); strings.TrimSpace(out) != "{}" {
			t.Fatalf("forget -o json printed %q, want {}", out)
		}
		if err := f.pending.Extend(t.Context(), time.Minute); err == nil {
			t.Fatal("the holder of the force-forgotten lease extended it")
		}
	})
}

func TestSettle(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		settle := f.cmd("keys", "settle", "-tenant", "acme", "-method", checkout, "order-7", "-code", "failed_precondition", "-message", "cancelled by an operator")
		fails(t, "FAILED_PRECONDITION: idem admin: the key's lease is live until 2026-01-02T03:05:05Z; set force", settle...)

		f.advance(2 * time.Minute) // the lease runs out: its caller is gone
		if out := ok(t, f.cmd("keys", "get", "-tenant", "acme", "-method", checkout, "order-7")...); !regexp.MustCompile(`(?m)^state: +abandoned$`).MatchString(out) {
			t.Fatalf("get order-7 after its lease ran out:\n%s\nwant it abandoned", out)
		}
		out := ok(t, settle...)
		for _, want := range []string{`(?m)^state: +recorded$`, `(?m)^outcome: +FAILED_PRECONDITION$`, `(?m)^message: +cancelled by an operator$`} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("settle printed\n%s\nwant a line matching %s", out, want)
			}
		}
		c, err := f.st.Claim(t.Context(), leased, store.ClaimRequest{Fingerprint: []byte("fp-7")})
		if err != nil || c.Entry == nil || c.Entry.State != store.Recorded || c.Entry.Outcome.Code != code.Code_FAILED_PRECONDITION {
			t.Fatalf("retry after the settle: %+v, %v; want the settled FAILED_PRECONDITION replayed", c, err)
		}

		fails(t, "FAILED_PRECONDITION: idem admin: the key's outcome is recorded already", settle...)
		fails(t, "NOT_FOUND: ", f.cmd("keys", "settle", "-tenant", "acme", "-method", checkout, "-key", "order-8", "-code", "9")...)
	})
}

// TestFinish: finish asks the server's finisher to run an abandoned call
// now. This server has none, and answers UNIMPLEMENTED, after the
// authorizer; the finisher's own runs are tested with the admin package
// and the checkout example.
func TestFinish(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		f.advance(2 * time.Minute) // order-7's lease runs out
		fails(t, "UNIMPLEMENTED: ", f.cmd("keys", "finish", "-tenant", "acme", "-method", checkout, "order-7")...)
	})
}

func TestPaging(t *testing.T) {
	onEachProtocol(t, func(t *testing.T, f *fixture) {
		resp := unmarshal(t, ok(t, f.cmd("keys", "list", "-all-tenants", "-limit", "1", "-all", "-o", "json")...), &adminv1.ListKeysResponse{})
		if len(resp.GetKeys()) != 2 || resp.GetKeys()[0].GetKey() != "order-7" || resp.GetKeys()[1].GetKey() != "pay-1" || resp.GetNextPageToken() != "" {
			t.Fatalf("list -limit 1 -all: %v, want order-7 and pay-1 and no next page", resp)
		}
		if got := rows(t, ok(t, f.cmd("keys", "list", "-all-tenants", "-limit", "1", "-all")...)); len(got) != 2 {
			t.Fatalf("list -limit 1 -all as a table: %q, want two rows", got)
		}

		out, errOut, exit := idem(t, f.cmd("keys", "list", "-all-tenants", "-limit", "1")...)
		m := regexp.MustCompile(`-page-token (\S+)`).FindStringSubmatch(errOut)
		if got := rows(t, out); exit != 0 || len(got) != 1 || got[0][0] != "order-7" || m == nil {
			t.Fatalf("list -limit 1: exit %d, rows %q, stderr %q; want order-7 and the next page's token", exit, got, errOut)
		}
		out, errOut, exit = idem(t, f.cmd("keys", "list", "-all-tenants", "-limit", "1", "-page-token", m[1])...)
		if got := rows(t, out); exit != 0 || len(got) != 1 || got[0][0] != "pay-1" || errOut != "" {
			t.Fatalf("list of the second page: exit %d, rows %q, stderr %q; want pay-1 and no next page", exit, got, errOut)
		}
		fails(t, "INVALID_ARGUMENT: ", f.cmd("keys", "list", "-tenant", "acme", "-limit", "1", "-page-token", m[1])...)
	})
}

func TestUsage(t *testing.T) {
	t.Setenv("IDEM_ADMIN_ADDR", "")
	addr := []string{"-addr", "127.0.0.1:1", "-insecure"}
	key := []string{"-tenant", "acme", "-method", checkout, "-key", "order-7"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"key"}, `unknown command "key"`},
		{[]string{"keys"}, "keys needs a subcommand"},
		{[]string{"keys", "drop"}, `unknown command "keys drop"`},
		{[]string{"keys", "list", "-tenant", "acme"}, "give -addr (or $IDEM_ADMIN_ADDR) or -database-url"},
		{[]string{"keys", "list", "-addr", "127.0.0.1:1", "-database-url", "postgres:///x"}, "not both"},
		{[]string{"keys", "list", "-database-url", "postgres:///x", "-H", "authorization: Bearer t"}, "-H applies to -addr"},
		{[]string{"keys", "list", "-database-url", "postgres:///x", "-protocol", "connect"}, "-protocol applies to -addr"},
		{append([]string{"keys", "list", "-protocol", "http"}, addr...), `-protocol is grpc or connect, not "http"`},
		{[]string{"keys", "list", "-addr", "admin.example:9091", "-insecure"}, "loopback addresses only"},
		{[]string{"keys", "list", "-addr", "admin.example"}, "is not host:port"},
		{[]string{"keys", "list", "-addr", "admin.example:9091", "-cert", "op.crt"}, "-cert and -cert-key go together"},
		{append([]string{"keys", "list", "-H", "no colon"}, addr...), "want 'name: value'"},
		{append([]string{"keys", "list", "-o", "yaml"}, addr...), "-o is table or json"},
		{append([]string{"keys", "list", "-state", "done"}, addr...), `"done" is not a state`},
		{append([]string{"keys", "list", "-created-after", "yesterday"}, addr...), "not an RFC 3339 time"},
		{append([]string{"keys", "list", "-tenant", "acme", "-all-tenants"}, addr...), "exclude each other"},
		{append([]string{"keys", "list", "-limit", "1001"}, addr...), "-limit must be"},
		{append([]string{"keys", "list", "stray"}, addr...), "list takes no arguments"},
		{append([]string{"keys", "list", "-nope"}, addr...), "flag provided but not defined: -nope"},
		{append([]string{"keys", "get", "-tenant", "acme", "-key", "k"}, addr...), "-method is required"},
		{append([]string{"keys", "get", "-tenant", "acme", "-method", checkout}, addr...), "-key (or the key as an argument) is required"},
		{append([]string{"keys", "get", "-key", "a", "-method", checkout, "b"}, addr...), "the key is given twice"},
		{append([]string{"keys", "forget", "-method", checkout, "a", "b"}, addr...), "too many arguments"},
		{append(append([]string{"keys", "settle"}, key...), addr...), "-code is required"},
		{append(append([]string{"keys", "settle", "-code", "OK"}, key...), addr...), "OK is not an error"},
		{append(append([]string{"keys", "settle", "-code", "0"}, key...), addr...), "OK is not an error"},
		{append(append([]string{"keys", "settle", "-code", "17"}, key...), addr...), "not a gRPC error code"},
		{append(append([]string{"keys", "settle", "-code", "Later"}, key...), addr...), "not a gRPC error code"},
		{append(append([]string{"keys", "settle", "-code", "9", "-force"}, key...), addr...), "-force needs -reason"},
		{append(append([]string{"keys", "forget", "-force", "-reason", " "}, key...), addr...), "-force needs -reason"},
		{append([]string{"keys", "list", "-watch", "-1s"}, addr...), "-watch must be positive"},
		{append([]string{"keys", "list", "-watch", "1s", "-page-token", "x"}, addr...), "drop -page-token"},
		{append([]string{"keys", "stats", "-tenant", "acme", "-all-tenants"}, addr...), "exclude each other"},
		{append([]string{"keys", "history", "-tenant", "acme", "-key", "k"}, addr...), "-method is required"},
		{append([]string{"audit"}, addr...), "audit needs a subcommand: list"},
		{append([]string{"audit", "list", "-key", "k"}, addr...), "-key needs -method"},
		{append([]string{"audit", "list", "-since", "today"}, addr...), "not an RFC 3339 time"},
		{[]string{"bulk"}, "bulk needs a subcommand"},
		{append([]string{"bulk", "drop"}, addr...), `unknown command "bulk drop"`},
		{append([]string{"bulk", "forget", "-reason", "r", "-yes"}, addr...), "-limit is required"},
		{append([]string{"bulk", "forget", "-limit", "10", "-yes"}, addr...), "-reason is required"},
		{append([]string{"bulk", "forget", "-limit", "10", "-reason", "r", "-yes", "-dry-run"}, addr...), "exclude each other"},
		{append([]string{"bulk", "settle", "-limit", "10", "-reason", "r", "-yes"}, addr...), "-code is required"},
		{append([]string{"bulk", "finish", "-limit", "10", "-reason", "r", "-yes", "-force"}, addr...), "flag provided but not defined: -force"},
	} {
		out, errOut, exit := idem(t, tc.args...)
		if exit != 2 || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("idem %q: exit %d, stdout %q, stderr %q; want exit 2 and %q on stderr", tc.args, exit, out, errOut, tc.want)
		}
	}
	for _, args := range [][]string{{"-h"}, {"help"}} {
		if out, _, exit := idem(t, args...); exit != 0 || !strings.Contains(out, "idem keys list") {
			t.Errorf("idem %q: exit %d, stdout %q; want exit 0 and the usage", args, exit, out)
		}
	}
	if _, errOut, exit := idem(t, "keys", "get", "-h"); exit != 0 || !strings.Contains(errOut, "-cert-key") {
		t.Errorf("idem keys get -h: exit %d, stderr %q; want exit 0 and the flags", exit, errOut)
	}
}

// TestCodeNames checks that -code takes a code by its google.rpc.Code
// name, grpc-go's name or its number, in any case.
func TestCodeNames(t *testing.T) {
	for _, v := range []string{"FAILED_PRECONDITION", "failed_precondition", "FailedPrecondition", "9"} {
		var c codeFlag
		if err := c.Set(v); err != nil || c != 9 {
			t.Errorf("-code %s: %v, %v; want FAILED_PRECONDITION", v, c, err)
		}
	}
	for _, v := range []string{"CANCELLED", "Canceled"} {
		var c codeFlag
		if err := c.Set(v); err != nil || c != 1 {
			t.Errorf("-code %s: %v, %v; want CANCELLED", v, c, err)
		}
	}
}

// TestDatabaseURL runs the commands against PostgreSQL directly: the
// admin service in the command's process over postgres.New.
func TestDatabaseURL(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	lease := seed(t, postgres.New(pool), func() {})
	t.Setenv("IDEM_ADMIN_ADDR", "127.0.0.1:1") // gives way to -database-url
	db := func(args ...string) []string { return append(args, "-database-url", dsn) }

	resp := unmarshal(t, ok(t, db("keys", "list", "-all-tenants", "-o", "json")...), &adminv1.ListKeysResponse{})
	if len(resp.GetKeys()) != 2 {
		t.Fatalf("list: %v, want two keys", resp)
	}
	byKey := map[string]*adminv1.Key{}
	for _, k := range resp.GetKeys() {
		byKey[k.GetKey()] = k
	}
	if k := byKey["pay-1"]; k.GetState() != adminv1.KeyState_KEY_STATE_RECORDED || k.GetOutcome().GetResponse().GetStructValue().GetFields()["value"].GetStringValue() != "paid" {
		t.Fatalf("pay-1: %v, want it recorded with its response", k)
	}
	if k := byKey["order-7"]; k.GetState() != adminv1.KeyState_KEY_STATE_IN_PROGRESS {
		t.Fatalf("order-7: %v, want it in progress", k)
	}

	// A page token printed by one run is accepted by the next.
	_, errOut, exit := idem(t, db("keys", "list", "-tenant", "acme", "-limit", "1")...)
	m := regexp.MustCompile(`-page-token (\S+)`).FindStringSubmatch(errOut)
	if exit != 0 || m == nil {
		t.Fatalf("list -limit 1: exit %d, stderr %q; want the next page's token", exit, errOut)
	}
	if got := rows(t, ok(t, db("keys", "list", "-tenant", "acme", "-limit", "1", "-page-token", m[1])...)); len(got) != 1 {
		t.Fatalf("second page: %q, want one key", got)
	}

	// A filter no key can hold is the operator's mistake, not the
	// database's failure.
	fails(t, "INVALID_ARGUMENT: idem admin: store: invalid scope: tenant filter contains a NUL byte", db("keys", "list", "-tenant", "a\x00b")...)
	fails(t, "INVALID_ARGUMENT: idem admin: store: invalid scope: method filter contains a NUL byte", db("keys", "list", "-all-tenants", "-method", "/a\x00b")...)

	// A code clients retry is refused on this path too, and leaves the key
	// as it was.
	fails(t, "INVALID_ARGUMENT: idem admin: store: invalid status: status.code ABORTED is a code clients retry",
		db("keys", "settle", "-tenant", "acme", "-method", checkout, "order-7", "-code", "ABORTED", "-message", "stuck", "-force", "-reason", "stuck")...)
	if k := unmarshal(t, ok(t, db("keys", "get", "-tenant", "acme", "-method", checkout, "order-7", "-o", "json")...), &adminv1.GetKeyResponse{}).GetKey(); k.GetState() != adminv1.KeyState_KEY_STATE_IN_PROGRESS || k.GetOutcome() != nil {
		t.Fatalf("order-7 after a refused settle: %v, want it in progress", k)
	}
	settle := db("keys", "settle", "-tenant", "acme", "-method", checkout, "order-7", "-code", "FAILED_PRECONDITION", "-message", "stuck")
	fails(t, "FAILED_PRECONDITION: idem admin: the key's lease is live until", settle...)
	settled := unmarshal(t, ok(t, append(settle, "-force", "-reason", "stuck", "-o", "json")...), &adminv1.SettleKeyResponse{})
	if k := settled.GetKey(); k.GetState() != adminv1.KeyState_KEY_STATE_RECORDED || k.GetOutcome().GetError().GetMessage() != "stuck" {
		t.Fatalf("settle -force: %v, want order-7 recorded with the error", k)
	}
	if err := lease.Extend(t.Context(), time.Minute); err == nil {
		t.Fatal("the holder of the force-settled lease extended it")
	}
	// The counts and a dry run before the forget, on PostgreSQL.
	stats := unmarshal(t, ok(t, db("keys", "stats", "-all-tenants", "-o", "json")...), &adminv1.GetKeyStatsResponse{})
	if c := stats.GetCounts(); len(c) != 2 || c[0].GetState() != adminv1.KeyState_KEY_STATE_RECORDED || c[1].GetState() != adminv1.KeyState_KEY_STATE_RECORDED {
		t.Errorf("stats: %v, want the two keys recorded", stats)
	}
	dry := unmarshal(t, ok(t, db("bulk", "forget", "-tenant", "acme", "-method", doMethod, "-limit", "10", "-reason", "r", "-dry-run", "-o", "json")...), &adminv1.KeyBatch{})
	if dry.GetCount() != 1 || len(dry.GetSample()) != 1 || dry.GetSample()[0].GetKey() != "pay-1" {
		t.Errorf("bulk forget -dry-run: %v, want pay-1", dry)
	}
	ok(t, db("keys", "forget", "-tenant", "acme", "-method", doMethod, "-key", "pay-1")...)
	fails(t, "NOT_FOUND: ", db("keys", "get", "-tenant", "acme", "-method", doMethod, "-key", "pay-1")...)

	// The audit trail, in the database: the forced settle and the forget,
	// by the database's user.
	trail := unmarshal(t, ok(t, db("audit", "list", "-tenant", "acme", "-o", "json")...), &adminv1.ListAuditResponse{})
	if es := trail.GetEntries(); len(es) != 2 ||
		es[0].GetKey() != "order-7" || es[0].GetAction() != adminv1.AuditAction_AUDIT_ACTION_SETTLE || !es[0].GetForce() || es[0].GetReason() != "stuck" ||
		es[0].GetStateBefore() != adminv1.KeyState_KEY_STATE_IN_PROGRESS || es[0].GetStateAfter() != adminv1.KeyState_KEY_STATE_RECORDED ||
		es[0].GetOperator() != "database user" ||
		es[1].GetKey() != "pay-1" || es[1].GetAction() != adminv1.AuditAction_AUDIT_ACTION_FORGET || es[1].GetStateBefore() != adminv1.KeyState_KEY_STATE_RECORDED {
		t.Errorf("audit list: %v, want the forced settle of order-7 and the forget of pay-1", trail)
	}
}

// TestTLS dials a server over TLS with -ca, -server-name and a client
// certificate, and a token with -H, which its authorizer reads from the
// admin.Request, with each protocol. The authorizer answers with gRPC
// statuses, which the Connect server sends with their codes too.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCert(t, "idem test CA", nil, nil)
	srvCert, srvKey := newCert(t, "admin.internal", ca, caKey)
	opCert, opKey := newCert(t, "oncall", ca, caKey)
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", ca.Raw)
	writePEM(t, filepath.Join(dir, "op.crt"), "CERTIFICATE", opCert.Raw)
	b, err := x509.MarshalPKCS8PrivateKey(opKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "op.key"), "PRIVATE KEY", b)

	pool := x509.NewCertPool()
	pool.AddCert(ca)
	cfg := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{srvCert.Raw}, PrivateKey: srvKey}},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
	}
	authorize := admin.AuthorizerFunc(func(_ context.Context, r admin.Request) (admin.Grant, error) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || r.TLS.VerifiedChains[0][0].Subject.CommonName != "oncall" {
			return admin.Grant{}, status.Error(codes.Unauthenticated, "dial with an operator's certificate")
		}
		if got := r.Header["authorization"]; len(got) != 1 || got[0] != "Bearer s3cret" {
			return admin.Grant{}, status.Error(codes.Unauthenticated, "no operator token")
		}
		return admin.Grant{Subject: "oncall", AllTenants: true}, nil
	})
	for _, protocol := range protocols {
		t.Run(protocol, func(t *testing.T) {
			addr := serve(t, protocol, cfg.Clone(), admin.NewServer(memory.New(), authorize, admin.WithLogger(slog.New(slog.DiscardHandler))))
			conn := []string{"-addr", addr, "-protocol", protocol, "-ca", filepath.Join(dir, "ca.crt"), "-server-name", "admin.internal"}
			cert := []string{"-cert", filepath.Join(dir, "op.crt"), "-cert-key", filepath.Join(dir, "op.key")}
			token := []string{"-H", "Authorization: Bearer s3cret"}
			list := func(args ...[]string) []string {
				all := []string{"keys", "list", "-tenant", "acme"}
				for _, a := range args {
					all = append(all, a...)
				}
				return all
			}
			if got := rows(t, ok(t, list(conn, cert, token)...)); len(got) != 0 {
				t.Fatalf("list: %q, want no keys", got)
			}
			fails(t, "UNAUTHENTICATED: no operator token", list(conn, cert)...)
			fails(t, "UNAUTHENTICATED: dial with an operator's certificate", list(conn, token)...)
			// Without -ca the server's certificate is checked against the
			// system's roots, which do not hold the test's CA.
			fails(t, "UNAVAILABLE: ", list(conn[:4], []string{"-server-name", "admin.internal"}, cert, token)...)
		})
	}
}

// newCert returns a certificate for name and its key, signed by parent
// (self-signed, as a CA, when parent is nil).
func newCert(t *testing.T, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
