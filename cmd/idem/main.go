package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/gen/idem/admin/v1/adminv1connect"
)

const usage = `Usage:
  idem keys list    [connection] [-tenant T | -all-tenants] [-method M] [-state S]...
                    [-created-after T] [-created-before T] [-limit N] [-page-token P] [-all]
                    [-watch D]
  idem keys stats   [connection] [-tenant T | -all-tenants] [-method M] [-state S]...
                    [-created-after T] [-created-before T]
  idem keys get     [connection] -tenant T -method M -key K   (or the key as an argument)
  idem keys history [connection] -tenant T -method M -key K
  idem keys forget  [connection] -tenant T -method M -key K [-force -reason R]
  idem keys settle  [connection] -tenant T -method M -key K -code C [-message M] [-force -reason R]
  idem keys finish  [connection] -tenant T -method M -key K [-reason R]
  idem audit list   [connection] [-tenant T | -all-tenants] [-method M [-key K]]
                    [-since T] [-until T] [-limit N] [-page-token P] [-all]
  idem bulk forget|settle|finish [connection] [list's filters] -limit N -reason R
                    [-force] [-code C -message M] [-dry-run | -yes] [-all] [-page-token P]

Connection, exactly one of:
  -addr host:port     a server's admin service (default $IDEM_ADMIN_ADDR), over TLS:
                      -ca file, -server-name N, -cert file -cert-key file (client certificate),
                      -H 'name: value' (metadata, e.g. an operator's token; repeatable),
                      or -insecure (plaintext, loopback addresses only);
                      -protocol grpc (default) or connect (a Connect handler, over HTTP)
  -database-url URL   the PostgreSQL database itself, in-process and without an
                      authorizer: the database's credentials are the authority
Output: -o table (default) or -o json (the service's messages as protobuf JSON).
-timeout bounds each call (default 30s).

list: -state is in_progress, abandoned, recorded or expired (repeat or comma list);
times are RFC 3339; -limit is the page size; -all follows page tokens;
-watch 5s lists again every 5 seconds until interrupted.
stats: counts per tenant, method and state, and the oldest key in progress and
abandoned; -state in_progress,abandoned reads only the keys in progress.
forget, settle, finish: -reason is kept in the audit trail (required with -force);
history and audit list print the audit trail: who did what, when and why.
bulk: acts on the keys that match the filters, -limit a call, each with the
single action's rules (a live lease is skipped unless -force), and prints each
key's result; without -yes it is a dry run on a terminal (a count and a
sample) and refused elsewhere; -all goes on until no key is left; progress and
the -page-token to resume with go to stderr.
settle: -code is a gRPC code name or number, never OK nor a code clients retry
(ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED); e.g. FAILED_PRECONDITION.

Exit status: 0 done, 1 the call failed (its code and message on stderr), 2 usage.
grpcurl works too where the server registers reflection. 'go doc
github.com/idemkit/idem/cmd/idem' has the details.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// statusOf returns the code and message of err, a call's error, and
// whether it has them: a gRPC status (-protocol grpc), a *connect.Error
// (-protocol connect) or the service's own answer, an *idem.Error, which
// has a Status method (-database-url).
func statusOf(err error) (code.Code, string, bool) {
	var ie interface{ Status() *spb.Status }
	if errors.As(err, &ie) {
		return code.Code(ie.Status().GetCode()), ie.Status().GetMessage(), true
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return code.Code(ce.Code()), ce.Message(), true
	}
	if st, ok := status.FromError(err); ok {
		return code.Code(st.Code()), st.Message(), true
	}
	return 0, "", false
}

// usageError is a command line the command cannot run. printed reports
// that the flag package printed it already.
type usageError struct {
	msg     string
	printed bool
}

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// run runs the command line args, the program's arguments without its
// name, and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := dispatch(ctx, args, stdout, stderr)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		if !ue.printed {
			fmt.Fprintf(stderr, "idem: %s\nRun 'idem -h' for usage.\n", ue.msg)
		}
		return 2
	}
	if c, msg, ok := statusOf(err); ok {
		fmt.Fprintf(stderr, "idem: %s: %s\n", c, msg)
		return 1
	}
	fmt.Fprintf(stderr, "idem: %v\n", err)
	return 1
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &usageError{msg: "no command", printed: true}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "keys":
	case "bulk":
		return bulkCommand(ctx, args[1:], stdout, stderr)
	case "audit":
		if len(args) < 2 || args[1] != "list" {
			return usagef("audit needs a subcommand: list")
		}
		return auditList(ctx, args[2:], stdout, stderr)
	default:
		return usagef("unknown command %q", args[0])
	}
	const subcommands = "list, stats, get, history, forget, settle or finish"
	if len(args) < 2 {
		return usagef("keys needs a subcommand: " + subcommands)
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"list":    list,
		"stats":   stats,
		"get":     get,
		"history": history,
		"forget":  forget,
		"settle":  settle,
		"finish":  finish,
	}
	cmd, ok := cmds[args[1]]
	if !ok {
		return usagef("unknown command \"keys %s\": want "+subcommands, args[1])
	}
	return cmd(ctx, args[2:], stdout, stderr)
}

// newFlagSet returns the flag set of "idem keys name", with the connection
// and output flags.
func newFlagSet(name string, stderr io.Writer) (*flag.FlagSet, *connection) {
	if !strings.Contains(name, " ") {
		name = "keys " + name
	}
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage of idem %s (see 'idem -h'):\n", name)
		fs.PrintDefaults()
	}
	c := &connection{}
	c.register(fs)
	return fs, c
}

// parse parses args with fs, letting flags and arguments come in any
// order, checks the connection flags, and returns the arguments.
func parse(fs *flag.FlagSet, c *connection, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{msg: err.Error(), printed: true}
		}
		rest := fs.Args()
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(pos, rest...), c.check(fs)
		}
		if len(rest) == 0 {
			return pos, c.check(fs)
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// keyFlags are the flags that name one key.
type keyFlags struct {
	tenant, method, key string
}

func (k *keyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.tenant, "tenant", "", "the key's `tenant` (default the empty tenant)")
	fs.StringVar(&k.method, "method", "", "the method's full name (/pkg.Service/Method) or scope")
	fs.StringVar(&k.key, "key", "", "the idempotency `key` (or give it as an argument)")
}

// resolve takes the key from the arguments, if given there, and checks
// that the key is named.
func (k *keyFlags) resolve(args []string) error {
	switch {
	case len(args) > 1:
		return usagef("too many arguments: %q", args)
	case len(args) == 1 && k.key != "" && k.key != args[0]:
		return usagef("the key is given twice: -key %q and %q", k.key, args[0])
	case len(args) == 1:
		k.key = args[0]
	}
	if k.method == "" {
		return usagef("-method is required")
	}
	if k.key == "" {
		return usagef("-key (or the key as an argument) is required")
	}
	return nil
}

func list(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("list", stderr)
	var (
		req           adminv1.ListKeysRequest
		states        stateFlag
		after, before timeFlag
		limit         int
		all           bool
		watch         time.Duration
	)
	fs.StringVar(&req.Tenant, "tenant", "", "list this `tenant`'s keys (default the empty tenant's)")
	fs.BoolVar(&req.AllTenants, "all-tenants", false, "list every tenant's keys")
	fs.StringVar(&req.Method, "method", "", "list the keys of this method's full name or scope")
	fs.Var(&states, "state", "list keys in this `state`: in_progress, abandoned, recorded, expired (repeatable, or a comma list)")
	fs.Var(&after, "created-after", "list keys claimed at or after this RFC 3339 `time`")
	fs.Var(&before, "created-before", "list keys claimed before this RFC 3339 `time`")
	fs.IntVar(&limit, "limit", 0, "at most `n` keys a page (default the service's, 100; at most 1000)")
	fs.StringVar(&req.PageToken, "page-token", "", "list the page this `token` (printed after the previous page) names")
	fs.BoolVar(&all, "all", false, "follow the page tokens to the last page")
	fs.DurationVar(&watch, "watch", 0, "list again every `duration` (such as 5s), until interrupted")
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) > 0:
		return usagef("list takes no arguments, got %q", rest)
	case req.AllTenants && req.Tenant != "":
		return usagef("-tenant and -all-tenants exclude each other")
	case limit < 0 || limit > 1000:
		return usagef("-limit must be between 1 and 1000")
	case watch < 0:
		return usagef("-watch must be positive")
	case watch > 0 && req.PageToken != "":
		return usagef("-watch lists from the first page: drop -page-token")
	}
	req.States, req.PageSize = states, int32(limit)
	req.CreatedAfter, req.CreatedBefore = after.ts, before.ts
	if watch == 0 {
		return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
			return listOnce(ctx, c, &req, all, client, stdout, stderr)
		})
	}
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		t := time.NewTicker(watch)
		defer t.Stop()
		for {
			fmt.Fprintf(stdout, "%s  (every %v; interrupt to stop)\n", time.Now().UTC().Format(time.RFC3339), watch)
			r := proto.CloneOf(&req)
			if err := listOnce(ctx, c, r, all, client, stdout, stderr); err != nil {
				if ctx.Err() != nil {
					return nil // interrupted
				}
				return err
			}
			fmt.Fprintln(stdout)
			select {
			case <-ctx.Done():
				return nil // interrupted: the watch's end
			case <-t.C:
			}
		}
	})
}

// listOnce lists the keys req selects, one page or, with all, every page,
// and prints them.
func listOnce(ctx context.Context, c *connection, req *adminv1.ListKeysRequest, all bool, client adminv1connect.AdminServiceClient, stdout, stderr io.Writer) error {
	return listing[*adminv1.ListKeysResponse, *adminv1.Key]{
		call: func(ctx context.Context, token string) (*adminv1.ListKeysResponse, error) {
			req.PageToken = token
			return call(ctx, c.timeout, req, client.ListKeys)
		},
		items: (*adminv1.ListKeysResponse).GetKeys,
		whole: func(keys []*adminv1.Key) proto.Message { return &adminv1.ListKeysResponse{Keys: keys} },
		print: printKeys,
		noun:  "keys",
	}.run(ctx, c, req.GetPageToken(), all, stdout, stderr)
}

// pageResponse is a List RPC's answer: a page, and the next one's token.
type pageResponse interface {
	proto.Message
	GetNextPageToken() string
}

// listing is how a List RPC's pages are fetched and printed.
type listing[Resp pageResponse, T any] struct {
	call  func(ctx context.Context, token string) (Resp, error) // the page token names
	items func(Resp) []T                                        // a page's items
	whole func([]T) proto.Message                               // every page's items, as one answer
	print func(io.Writer, []T)                                  // items as a table
	noun  string                                                // what the items are, plural
}

// run lists from the page token names: that page or, with all, it and
// every page after it. It prints them as c's output asks: one answer in
// JSON, or a table and, after a single page with more to come, how to ask
// for the rest, on stderr.
func (l listing[Resp, T]) run(ctx context.Context, c *connection, token string, all bool, stdout, stderr io.Writer) error {
	var items []T
	for {
		resp, err := l.call(ctx, token)
		if err != nil {
			return err
		}
		if !all {
			if c.json() {
				return printJSON(stdout, resp)
			}
			l.print(stdout, l.items(resp))
			if t := resp.GetNextPageToken(); t != "" {
				fmt.Fprintf(stderr, "More %s: add -page-token %s (or list with -all)\n", l.noun, t)
			}
			return nil
		}
		items = append(items, l.items(resp)...)
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if c.json() {
		return printJSON(stdout, l.whole(items))
	}
	l.print(stdout, items)
	return nil
}

func get(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("get", stderr)
	var k keyFlags
	k.register(fs)
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	if err := k.resolve(rest); err != nil {
		return err
	}
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		resp, err := call(ctx, c.timeout, &adminv1.GetKeyRequest{Tenant: k.tenant, Method: k.method, Key: k.key}, client.GetKey)
		if err != nil {
			return err
		}
		if c.json() {
			return printJSON(stdout, resp)
		}
		return printKey(stdout, resp.GetKey())
	})
}

func forget(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("forget", stderr)
	var (
		k      keyFlags
		force  bool
		reason string
	)
	k.register(fs)
	fs.BoolVar(&force, "force", false, "forget a key whose lease is live, fencing its holder (give -reason)")
	fs.StringVar(&reason, "reason", "", "why, for the audit trail (required with -force)")
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	if err := k.resolve(rest); err != nil {
		return err
	}
	if force && strings.TrimSpace(reason) == "" {
		return usagef("-force needs -reason: a forced action fences the call that holds the key, and the audit trail keeps why")
	}
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		resp, err := call(ctx, c.timeout, &adminv1.ForgetKeyRequest{Tenant: k.tenant, Method: k.method, Key: k.key, Force: force, Reason: reason}, client.ForgetKey)
		if err != nil {
			return err
		}
		if c.json() {
			return printJSON(stdout, resp)
		}
		fmt.Fprintf(stdout, "Forgot key %q of tenant %q, method %s: its next request runs afresh.\n", k.key, k.tenant, k.method)
		return nil
	})
}

func settle(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("settle", stderr)
	var (
		k       keyFlags
		cd      codeFlag
		message string
		force   bool
		reason  string
	)
	k.register(fs)
	fs.StringVar(&reason, "reason", "", "why, for the audit trail (required with -force)")
	fs.Var(&cd, "code", "the error's gRPC `code`, by name (FAILED_PRECONDITION) or number; never OK nor a code clients retry (ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED)")
	fs.StringVar(&message, "message", "", "the error's `message`")
	fs.BoolVar(&force, "force", false, "settle a key whose lease is live, fencing its holder (give -reason)")
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	if err := k.resolve(rest); err != nil {
		return err
	}
	if cd == 0 {
		return usagef("-code is required: the error that the key's retries are to replay")
	}
	if force && strings.TrimSpace(reason) == "" {
		return usagef("-force needs -reason: a forced action fences the call that holds the key, and the audit trail keeps why")
	}
	req := &adminv1.SettleKeyRequest{Tenant: k.tenant, Method: k.method, Key: k.key, Force: force, Reason: reason,
		Status: &spb.Status{Code: int32(cd), Message: message}}
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		resp, err := call(ctx, c.timeout, req, client.SettleKey)
		if err != nil {
			return err
		}
		if c.json() {
			return printJSON(stdout, resp)
		}
		return printKey(stdout, resp.GetKey())
	})
}

func finish(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("finish", stderr)
	var (
		k      keyFlags
		reason string
	)
	k.register(fs)
	fs.StringVar(&reason, "reason", "", "why, for the audit trail")
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	if err := k.resolve(rest); err != nil {
		return err
	}
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		resp, err := call(ctx, c.timeout, &adminv1.FinishKeyRequest{Tenant: k.tenant, Method: k.method, Key: k.key, Reason: reason}, client.FinishKey)
		if err != nil {
			return err
		}
		if c.json() {
			return printJSON(stdout, resp)
		}
		return printKey(stdout, resp.GetKey())
	})
}

// call calls rpc with req, bounded by timeout.
func call[Req, Resp any](ctx context.Context, timeout time.Duration, req *Req, rpc func(context.Context, *Req) (*Resp, error)) (*Resp, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rpc(ctx, req)
}

// stateFlag is -state: states by their lower-case names, repeated or in a
// comma list.
type stateFlag []adminv1.KeyState

func (s *stateFlag) String() string {
	names := make([]string, len(*s))
	for i, st := range *s {
		names[i] = stateName(st)
	}
	return strings.Join(names, ",")
}

func (s *stateFlag) Set(v string) error {
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		st, ok := adminv1.KeyState_value["KEY_STATE_"+strings.ToUpper(name)]
		if !ok || st == 0 {
			return fmt.Errorf("%q is not a state: want in_progress, abandoned, recorded or expired", name)
		}
		*s = append(*s, adminv1.KeyState(st))
	}
	return nil
}

// stateName is st's name as -state takes it.
func stateName(st adminv1.KeyState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "KEY_STATE_"))
}

// timeFlag is an RFC 3339 time.
type timeFlag struct{ ts *timestamppb.Timestamp }

func (t *timeFlag) String() string {
	if t.ts == nil {
		return ""
	}
	return t.ts.AsTime().Format(time.RFC3339Nano)
}

func (t *timeFlag) Set(v string) error {
	tm, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return fmt.Errorf("%q is not an RFC 3339 time, such as 2026-01-02T15:04:05Z", v)
	}
	t.ts = timestamppb.New(tm)
	return nil
}

// codeFlag is -code: a gRPC code other than OK, by name or number.
type codeFlag codes.Code

func (c *codeFlag) String() string {
	if *c == 0 {
		return ""
	}
	return code.Code(*c).String()
}

func (c *codeFlag) Set(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		n = -1
		if x, ok := code.Code_value[strings.ToUpper(v)]; ok {
			n = int(x)
		}
		for i := range 17 {
			if strings.EqualFold(codes.Code(i).String(), v) {
				n = i
			}
		}
	}
	switch {
	case n == 0:
		return errors.New("OK is not an error: a response is the method's own to make, so a key is settled with an error")
	case n < 1 || n > 16:
		return fmt.Errorf("%q is not a gRPC error code (a name such as FAILED_PRECONDITION, or 1 to 16)", v)
	}
	*c = codeFlag(n)
	return nil
}
