package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/proto"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/gen/idem/admin/v1/adminv1connect"
)

func stats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("stats", stderr)
	var (
		req           adminv1.GetKeyStatsRequest
		states        stateFlag
		after, before timeFlag
	)
	fs.StringVar(&req.Tenant, "tenant", "", "count this `tenant`'s keys (default the empty tenant's)")
	fs.BoolVar(&req.AllTenants, "all-tenants", false, "count every tenant's keys, per tenant")
	fs.StringVar(&req.Method, "method", "", "count the keys of this method's full name or scope")
	fs.Var(&states, "state", "count keys in this `state`: in_progress, abandoned, recorded, expired (repeatable, or a comma list)")
	fs.Var(&after, "created-after", "count keys claimed at or after this RFC 3339 `time`")
	fs.Var(&before, "created-before", "count keys claimed before this RFC 3339 `time`")
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) > 0:
		return usagef("stats takes no arguments, got %q", rest)
	case req.AllTenants && req.Tenant != "":
		return usagef("-tenant and -all-tenants exclude each other")
	}
	req.States, req.CreatedAfter, req.CreatedBefore = states, after.ts, before.ts
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		resp, err := call(ctx, c.timeout, &req, client.GetKeyStats)
		if err != nil {
			return err
		}
		if c.json() {
			return printJSON(stdout, resp)
		}
		printStats(stdout, resp)
		return nil
	})
}

// printStats prints the counts as a table, then the oldest keys stuck.
func printStats(w io.Writer, resp *adminv1.GetKeyStatsResponse) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tMETHOD\tSTATE\tCOUNT")
	for _, n := range resp.GetCounts() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", orDash(n.GetTenant()), n.GetMethod(), stateName(n.GetState()), n.GetCount())
	}
	tw.Flush()
	for _, o := range []struct {
		name string
		k    *adminv1.Key
	}{{"oldest in progress", resp.GetOldestInProgress()}, {"oldest abandoned", resp.GetOldestAbandoned()}} {
		if o.k == nil {
			fmt.Fprintf(w, "%s: none\n", o.name)
			continue
		}
		fmt.Fprintf(w, "%s: %s (tenant %s, method %s), created %s, lease until %s\n", o.name, o.k.GetKey(), orDash(o.k.GetTenant()),
			o.k.GetMethod(), timeOf(o.k.GetCreateTime()), timeOf(o.k.GetLeaseExpireTime()))
	}
}

func history(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("history", stderr)
	var k keyFlags
	k.register(fs)
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	if err := k.resolve(rest); err != nil {
		return err
	}
	req := &adminv1.ListAuditRequest{Tenant: k.tenant, Method: k.method, Key: k.key, PageSize: 1000}
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		return listAudit(ctx, c, req, true, client, stdout, stderr)
	})
}

func auditList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("audit list", stderr)
	var (
		req          adminv1.ListAuditRequest
		since, until timeFlag
		limit        int
		all          bool
	)
	fs.StringVar(&req.Tenant, "tenant", "", "list this `tenant`'s entries (default the empty tenant's)")
	fs.BoolVar(&req.AllTenants, "all-tenants", false, "list every tenant's entries")
	fs.StringVar(&req.Method, "method", "", "list the entries of this method's full name or scope")
	fs.StringVar(&req.Key, "key", "", "with -method, list the entries of this `key`")
	fs.Var(&since, "since", "list entries at or after this RFC 3339 `time`")
	fs.Var(&until, "until", "list entries before this RFC 3339 `time`")
	fs.IntVar(&limit, "limit", 0, "at most `n` entries a page (default the service's, 100; at most 1000)")
	fs.StringVar(&req.PageToken, "page-token", "", "list the page this `token` (printed after the previous page) names")
	fs.BoolVar(&all, "all", false, "follow the page tokens to the last page")
	rest, err := parse(fs, c, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) > 0:
		return usagef("audit list takes no arguments, got %q", rest)
	case req.AllTenants && req.Tenant != "":
		return usagef("-tenant and -all-tenants exclude each other")
	case req.Key != "" && req.Method == "":
		return usagef("-key needs -method")
	case limit < 0 || limit > 1000:
		return usagef("-limit must be between 1 and 1000")
	}
	req.StartTime, req.EndTime, req.PageSize = since.ts, until.ts, int32(limit)
	return c.do(ctx, stderr, func(ctx context.Context, client adminv1connect.AdminServiceClient) error {
		return listAudit(ctx, c, &req, all, client, stdout, stderr)
	})
}

// listAudit lists the entries req selects, one page or, with all, every
// page, and prints them.
func listAudit(ctx context.Context, c *connection, req *adminv1.ListAuditRequest, all bool, client adminv1connect.AdminServiceClient, stdout, stderr io.Writer) error {
	return listing[*adminv1.ListAuditResponse, *adminv1.AuditEntry]{
		call: func(ctx context.Context, token string) (*adminv1.ListAuditResponse, error) {
			req.PageToken = token
			return call(ctx, c.timeout, req, client.ListAudit)
		},
		items: (*adminv1.ListAuditResponse).GetEntries,
		whole: func(entries []*adminv1.AuditEntry) proto.Message {
			return &adminv1.ListAuditResponse{Entries: entries}
		},
		print: printAudit,
		noun:  "entries",
	}.run(ctx, c, req.GetPageToken(), all, stdout, stderr)
}

// printAudit prints entries as a table, one entry a row.
func printAudit(w io.Writer, entries []*adminv1.AuditEntry) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tACTION\tKEY\tTENANT\tMETHOD\tOPERATOR\tFORCE\tBEFORE\tAFTER\tREASON")
	for _, e := range entries {
		after := "-"
		if e.GetStateAfter() != adminv1.KeyState_KEY_STATE_UNSPECIFIED {
			after = stateName(e.GetStateAfter())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", timeOf(e.GetTime()),
			strings.ToLower(strings.TrimPrefix(e.GetAction().String(), "AUDIT_ACTION_")), e.GetKey(), orDash(e.GetTenant()), e.GetMethod(),
			orDash(e.GetOperator()), strconv.FormatBool(e.GetForce()), stateName(e.GetStateBefore()), after, orDash(strconv.Quote(e.GetReason())[1:len(strconv.Quote(e.GetReason()))-1]))
	}
	tw.Flush()
}
