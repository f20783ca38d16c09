package admin

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/store"
)

var auditActions = map[store.AuditAction]adminv1.AuditAction{
	store.ActionForget: adminv1.AuditAction_AUDIT_ACTION_FORGET,
	store.ActionSettle: adminv1.AuditAction_AUDIT_ACTION_SETTLE,
	store.ActionFinish: adminv1.AuditAction_AUDIT_ACTION_FINISH,
}

// ListAudit lists the audit trail's entries that match the request's
// filter, a page at a time: one key's history with a method and a key.
func (s *Server) ListAudit(ctx context.Context, req *adminv1.ListAuditRequest) (*adminv1.ListAuditResponse, error) {
	r := Request{Method: listAudit, Tenant: req.GetTenant(), AllTenants: req.GetAllTenants()}
	if r.AllTenants {
		r.Tenant = ""
	}
	if req.GetKey() != "" {
		r.Key = store.Scope{Tenant: r.Tenant, Method: req.GetMethod(), Key: req.GetKey()}
	}
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	f := store.AuditFilter{Tenant: req.GetTenant(), AllTenants: req.GetAllTenants(), Method: req.GetMethod(), Key: req.GetKey()}
	if f.AllTenants && f.Tenant != "" {
		return nil, c.end(ctx, invalid("tenant must be empty with all_tenants"), nil)
	}
	if err := f.Validate(); err != nil {
		return nil, c.end(ctx, invalid("%s", rule(err, store.ErrInvalidAudit)), nil)
	}
	if err := timeRange(&f.Since, &f.Until, "start_time", req.GetStartTime(), "end_time", req.GetEndTime()); err != nil {
		return nil, c.end(ctx, err, nil)
	}
	if f.Limit, err = pageSize(req.GetPageSize()); err != nil {
		return nil, c.end(ctx, err, nil)
	}
	f.After, err = s.tokens.open(auditListing(f), req.GetPageToken())
	if err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	entries, next, err := s.st.AuditLog(ctx, f)
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	resp := &adminv1.ListAuditResponse{NextPageToken: s.tokens.seal(auditListing(f), next)}
	for _, e := range entries {
		if !c.grant.Allows(e.Scope.Tenant) {
			// The store answered outside the filter: show nothing of it.
			return nil, c.fail(ctx, fmt.Errorf("the store listed an audit entry of tenant %q for a filter of tenant %q", e.Scope.Tenant, f.Tenant))
		}
		resp.Entries = append(resp.Entries, &adminv1.AuditEntry{
			Time:        timestamppb.New(e.Time),
			Tenant:      e.Scope.Tenant,
			Method:      e.Scope.Method,
			Key:         e.Scope.Key,
			Action:      auditActions[e.Action],
			Operator:    e.Operator,
			Reason:      e.Reason,
			Force:       e.Force,
			StateBefore: protoStates[e.Before],
			StateAfter:  protoStates[e.After],
			RequestId:   e.RequestID,
			Peer:        e.Peer,
		})
	}
	return resp, c.end(ctx, nil, nil)
}

// GetKeyStats counts the keys that match the request's filter by tenant,
// method and state, with the oldest in progress and abandoned.
func (s *Server) GetKeyStats(ctx context.Context, req *adminv1.GetKeyStatsRequest) (*adminv1.GetKeyStatsResponse, error) {
	r := Request{Method: getKeyStats, Tenant: req.GetTenant(), AllTenants: req.GetAllTenants()}
	if r.AllTenants {
		r.Tenant = ""
	}
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	f, err := filter(&adminv1.ListKeysRequest{Tenant: req.GetTenant(), AllTenants: req.GetAllTenants(), Method: req.GetMethod(),
		States: req.GetStates(), CreatedAfter: req.GetCreatedAfter(), CreatedBefore: req.GetCreatedBefore()})
	if err != nil {
		return nil, c.end(ctx, err, nil)
	}
	st, err := s.st.Stats(ctx, f)
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	resp := &adminv1.GetKeyStatsResponse{}
	for _, n := range st.Counts {
		if !c.grant.Allows(n.Tenant) {
			return nil, c.fail(ctx, fmt.Errorf("the store counted keys of tenant %q for a filter of tenant %q", n.Tenant, f.Tenant))
		}
		resp.Counts = append(resp.Counts, &adminv1.KeyCount{Tenant: n.Tenant, Method: n.Method, State: protoStates[n.State], Count: n.Count})
	}
	for _, o := range []struct {
		ki *store.KeyInfo
		to **adminv1.Key
	}{{st.OldestInProgress, &resp.OldestInProgress}, {st.OldestAbandoned, &resp.OldestAbandoned}} {
		if o.ki == nil {
			continue
		}
		if !c.grant.Allows(o.ki.Scope.Tenant) {
			return nil, c.fail(ctx, fmt.Errorf("the store returned a key of tenant %q for a filter of tenant %q", o.ki.Scope.Tenant, f.Tenant))
		}
		*o.to = s.key(ctx, *o.ki)
	}
	return resp, c.end(ctx, nil, nil)
}

// timeRange sets *from and *to from the timestamps fromTS and toTS, each
// when set, named fromName and toName in an INVALID_ARGUMENT answer.
func timeRange(from, to *time.Time, fromName string, fromTS *timestamppb.Timestamp, toName string, toTS *timestamppb.Timestamp) error {
	for _, t := range []struct {
		name string
		ts   *timestamppb.Timestamp
		to   *time.Time
	}{{fromName, fromTS, from}, {toName, toTS, to}} {
		if t.ts == nil {
			continue
		}
		if err := t.ts.CheckValid(); err != nil {
			return invalid("%s is not a valid timestamp", t.name)
		}
		*t.to = t.ts.AsTime()
	}
	return nil
}

// pageSize returns the store's limit of a page_size: at most 1000.
func pageSize(n int32) (int, error) {
	switch {
	case n < 0:
		return 0, invalid("page_size is negative")
	case n > 1000:
		return 1000, nil
	}
	return int(n), nil
}
