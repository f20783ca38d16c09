package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/gen/idem/admin/v1/adminv1connect"
)

// isTerminal reports whether the command's standard input is a terminal,
// where an action on many keys without -yes is a dry run: a character
// device other than the null device (a terminal is one; a pipe, a file
// and /dev/null, a script's usual input, are not). A variable, so that
// tests can say.
var isTerminal = stdinIsTerminal

func stdinIsTerminal() bool {
	fi, err := os.Stdin.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}

// bulkFlags are the flags of idem bulk forget, settle and finish.
type bulkFlags struct {
	sel           adminv1.KeySelection
	states        stateFlag
	after, before timeFlag
	limit         int
	reason        string
	force         bool
	dryRun, yes   bool
	all           bool
	pageToken     string
}

func (b *bulkFlags) register(fs *flag.FlagSet, force bool) {
	fs.StringVar(&b.sel.Tenant, "tenant", "", "act on this `tenant`'s keys (default the empty tenant's)")
	fs.BoolVar(&b.sel.AllTenants, "all-tenants", false, "act on every tenant's keys")
	fs.StringVar(&b.sel.Method, "method", "", "act on the keys of this method's full name or scope")
	fs.Var(&b.states, "state", "act on keys in this `state`: in_progress, abandoned, recorded, expired (repeatable, or a comma list)")
	fs.Var(&b.after, "created-after", "act on keys claimed at or after this RFC 3339 `time`")
	fs.Var(&b.before, "created-before", "act on keys claimed before this RFC 3339 `time`")
	fs.IntVar(&b.limit, "limit", 0, "act on at most `n` keys a call, 1 to 1000 (required)")
	fs.StringVar(&b.reason, "reason", "", "why, for the audit trail of every key (required)")
	if force {
		fs.BoolVar(&b.force, "force", false, "act on keys whose lease is live too, fencing their holders")
	}
	fs.BoolVar(&b.dryRun, "dry-run", false, "change nothing: print how many keys match and the first -limit of them (the default on a terminal without -yes)")
	fs.BoolVar(&b.yes, "yes", false, "act, without a dry run first")
	fs.BoolVar(&b.all, "all", false, "act call after call until no key is left (else one call of -limit keys)")
	fs.StringVar(&b.pageToken, "page-token", "", "resume after the call that printed this `token`")
}

// check checks the flags and decides on a dry run.
func (b *bulkFlags) check(name string, rest []string) error {
	switch {
	case len(rest) > 0:
		return usagef("bulk %s takes no arguments, got %q", name, rest)
	case b.sel.AllTenants && b.sel.Tenant != "":
		return usagef("-tenant and -all-tenants exclude each other")
	case b.limit < 1 || b.limit > 1000:
		return usagef("-limit is required: 1 to 1000 keys a call")
	case strings.TrimSpace(b.reason) == "":
		return usagef("-reason is required: the audit trail keeps it for every key")
	case b.dryRun && b.yes:
		return usagef("-dry-run and -yes exclude each other")
	case !b.dryRun && !b.yes:
		if !isTerminal() {
			return usagef("give -yes to act on the keys, or -dry-run to see which they are")
		}
		b.dryRun = true
	}
	b.sel.States, b.sel.CreatedAfter, b.sel.CreatedBefore = b.states, b.after.ts, b.before.ts
	return nil
}

func bulkCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("bulk needs a subcommand: forget, settle or finish")
	}
	name, args := args[0], args[1:]
	fs, c := newFlagSet("bulk "+name, stderr)
	var b bulkFlags
	var (
		cd      codeFlag
		message string
	)
	var call func(ctx context.Context, client adminv1connect.AdminServiceClient, token string) (*adminv1.KeyBatch, error)
	switch name {
	case "forget":
		b.register(fs, true)
		call = func(ctx context.Context, client adminv1connect.AdminServiceClient, token string) (*adminv1.KeyBatch, error) {
			resp, err := client.ForgetKeys(ctx, &adminv1.ForgetKeysRequest{Selection: &b.sel, Limit: int32(b.limit), DryRun: b.dryRun,
				Force: b.force, Reason: b.reason, PageToken: token})
			return resp.GetBatch(), err
		}
	case "settle":
		b.register(fs, true)
		fs.Var(&cd, "code", "the error's gRPC `code`, as keys settle takes it (required)")
		fs.StringVar(&message, "message", "", "the error's `message`")
		call = func(ctx context.Context, client adminv1connect.AdminServiceClient, token string) (*adminv1.KeyBatch, error) {
			resp, err := client.SettleKeys(ctx, &adminv1.SettleKeysRequest{Selection: &b.sel, Limit: int32(b.limit), DryRun: b.dryRun,
				Force: b.force, Reason: b.reason, PageToken: token, Status: &spb.Status{Code: int32(cd), Message: message}})
			return resp.GetBatch(), err
		}
	case "finish":
		b.register(fs, false)
		call = func(ctx context.Context, client adminv1connect.AdminServiceClient, token string) (*adminv1.KeyBatch, error) {
			resp, err := client.FinishKeys(ctx, &adminv1.FinishKeysRequest{Selection: &b.sel, Limit: int32(b.limit), DryRun: b.dryRun,
				Reason: b.reason, PageToken: token})
			return resp.GetBatch(), err
		}
	default:
		return usagef("unknown command \"bulk %s\": want forget, settle or finish", name)
	}
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	if err := b.check(name, rest); err != nil {
		return err
	}
	if name == "settle" && cd == 0 {
		return usagef("-code is required: the error that the keys' retries are to replay")
	}
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		return runBulk(ctx, c, &b, name, client, call, stdout, stderr)
	})
}

// runBulk makes the calls of an action on many keys, printing each key's
// result and, on stderr, the progress and the token to resume with.
func runBulk(ctx context.Context, c *connection, b *bulkFlags, name string, client adminv1connect.AdminServiceClient,
	call func(context.Context, adminv1connect.AdminServiceClient, string) (*adminv1.KeyBatch, error), stdout, stderr io.Writer) error {
	do := func(token string) (*adminv1.KeyBatch, error) {
		ctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		return call(ctx, client, token)
	}
	if b.dryRun {
		batch, err := do(b.pageToken)
		if err != nil {
			return err
		}
		if c.json() {
			return printJSON(stdout, batch)
		}
		fmt.Fprintf(stdout, "Dry run: %d keys match; the first %d, which one call would %s:\n", batch.GetCount(), len(batch.GetSample()), name)
		printKeys(stdout, batch.GetSample())
		fmt.Fprintf(stderr, "Nothing was changed. Add -yes to %s them (-all for every key).\n", name)
		return nil
	}
	var (
		all           = &adminv1.KeyBatch{}
		done, skipped int
		token         = b.pageToken
		header        = true
	)
	for {
		batch, err := do(token)
		if err != nil {
			if token != "" {
				fmt.Fprintf(stderr, "Stopped: resume with -page-token %s\n", token)
			}
			return err
		}
		for _, r := range batch.GetResults() {
			if r.GetOutcome() == adminv1.KeyResult_OUTCOME_DONE {
				done++
			} else {
				skipped++
			}
		}
		if c.json() {
			all.Results = append(all.Results, batch.GetResults()...)
		} else {
			printResults(stdout, batch.GetResults(), header)
			header = false
		}
		token = batch.GetNextPageToken()
		fmt.Fprintf(stderr, "%s: %d done, %d skipped", name, done, skipped)
		if token != "" {
			fmt.Fprintf(stderr, "; resume with -page-token %s", token)
		}
		fmt.Fprintln(stderr)
		if token == "" || !b.all {
			break
		}
	}
	if c.json() {
		all.NextPageToken = token
		return printJSON(stdout, proto.Message(all))
	}
	return nil
}

// printResults prints results as a table, one key a row, with the header
// when header is set.
func printResults(w io.Writer, results []*adminv1.KeyResult, header bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "KEY\tTENANT\tMETHOD\tRESULT\tWHY")
	}
	for _, r := range results {
		result, why := "done", "-"
		if r.GetOutcome() != adminv1.KeyResult_OUTCOME_DONE {
			result, why = "skipped", r.GetStatus().GetMessage()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.GetKey(), orDash(r.GetTenant()), r.GetMethod(), result, why)
	}
	tw.Flush()
}
