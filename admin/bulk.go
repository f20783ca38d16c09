package admin

import (
	"context"
	"fmt"
	"hash"
	"log/slog"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/code"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/internal/adminwire"
	"github.com/idemkit/idem/store"
)

// The full names of the RPCs on many keys.
const (
	forgetKeys = service + "ForgetKeys"
	settleKeys = service + "SettleKeys"
	finishKeys = service + "FinishKeys"
)

// maxBatch is the most keys an action on many keys acts on in one call.
const maxBatch = 1000

// bulkListing is the listing of an action on many keys: its selection and
// the RPC, so that its page tokens serve that RPC with that selection only.
// Its first byte, 3, is one no other listing writes first.
type bulkListing struct {
	f      store.KeyFilter
	method string
}

func (b bulkListing) writeTo(h hash.Hash) {
	h.Write([]byte{3})
	writeString(h, b.method)
	writeFilter(h, b.f)
}

// bulk is an action on many keys, as its RPC asked for it.
type bulk struct {
	method    string
	sel       *adminv1.KeySelection
	limit     int32
	dryRun    bool
	force     bool
	reason    string
	pageToken string
	// check checks what the action needs beyond the rest, after the call
	// is authorized; it returns the answer that refuses the call, or nil.
	check func() error
	// act acts on one key: it returns nil when it did, else the answer of
	// the action on that key alone and the error behind it to log.
	act func(ctx context.Context, c *call, k store.Scope) (answer, cause error)
}

// run runs b: it authorizes the call, checks it, and acts on the keys of
// one page of its selection, one by one, or, for a dry run, counts them
// and returns the page as the sample.
func (s *Server) run(ctx context.Context, b bulk) (*adminv1.KeyBatch, error) {
	sel := b.sel
	r := Request{Method: b.method, Tenant: sel.GetTenant(), AllTenants: sel.GetAllTenants(), Force: b.force, Reason: b.reason}
	if r.AllTenants {
		r.Tenant = ""
	}
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	f, err := filter(&adminv1.ListKeysRequest{Tenant: sel.GetTenant(), AllTenants: sel.GetAllTenants(), Method: sel.GetMethod(),
		States: sel.GetStates(), CreatedAfter: sel.GetCreatedAfter(), CreatedBefore: sel.GetCreatedBefore()})
	if err != nil {
		return nil, c.end(ctx, err, nil)
	}
	switch {
	case b.limit < 1 || b.limit > maxBatch:
		return nil, c.end(ctx, invalid("limit is required: the most keys the call acts on, 1 to %d", maxBatch), nil)
	case strings.TrimSpace(b.reason) == "":
		return nil, c.end(ctx, invalid("an action on many keys needs a reason, for the audit trail"), nil)
	}
	if err := store.ValidateReason(b.reason); err != nil {
		return nil, c.end(ctx, invalid("%s", rule(err, store.ErrInvalidAudit)), nil)
	}
	if b.check != nil {
		if err := b.check(); err != nil {
			return nil, c.end(ctx, err, nil)
		}
	}
	f.Limit = int(b.limit)
	listing := bulkListing{f: f, method: b.method}
	if f.After, err = s.tokens.open(listing, b.pageToken); err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	infos, next, err := s.st.Keys(ctx, f)
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	for _, ki := range infos {
		if !c.grant.Allows(ki.Scope.Tenant) {
			// The store answered outside the filter: touch nothing of it.
			return nil, c.fail(ctx, fmt.Errorf("the store listed a key of tenant %q for a filter of tenant %q", ki.Scope.Tenant, f.Tenant))
		}
	}
	batch := &adminv1.KeyBatch{}
	if b.dryRun {
		st, err := s.st.Stats(ctx, f)
		if err != nil {
			return nil, c.fail(ctx, err)
		}
		for _, n := range st.Counts {
			batch.Count += n.Count
		}
		for _, ki := range infos {
			batch.Sample = append(batch.Sample, s.key(ctx, ki))
		}
		return batch, c.end(ctx, nil, nil)
	}
	for _, ki := range infos {
		if err := ctx.Err(); err != nil {
			// The caller is gone: what was done is in the audit trail, and
			// the same page token acts on the keys left.
			return nil, c.fail(ctx, err)
		}
		k := ki.Scope
		res := &adminv1.KeyResult{Tenant: k.Tenant, Method: k.Method, Key: k.Key, Outcome: adminv1.KeyResult_OUTCOME_DONE}
		if answer, cause := b.act(ctx, c, k); answer != nil {
			res.Outcome = adminv1.KeyResult_OUTCOME_SKIPPED
			res.Status, _ = adminwire.Status(answer)
			if cause != nil {
				s.log().LogAttrs(ctx, slog.LevelWarn, "idem admin: an action on many keys skipped a key", slog.String("rpc", b.method),
					slog.String("tenant", k.Tenant), slog.String("method", k.Method), slog.String("key", k.Key), slog.String("error", cause.Error()))
			}
		}
		batch.Results = append(batch.Results, res)
	}
	batch.NextPageToken = s.tokens.seal(listing, next)
	return batch, c.end(ctx, nil, nil)
}

// ForgetKeys forgets the keys a selection matches, a page at a time, as
// ForgetKey forgets one.
func (s *Server) ForgetKeys(ctx context.Context, req *adminv1.ForgetKeysRequest) (*adminv1.ForgetKeysResponse, error) {
	batch, err := s.run(ctx, bulk{
		method: forgetKeys, sel: req.GetSelection(), limit: req.GetLimit(), dryRun: req.GetDryRun(),
		force: req.GetForce(), reason: req.GetReason(), pageToken: req.GetPageToken(),
		act: func(ctx context.Context, c *call, k store.Scope) (error, error) {
			if err := s.st.Forget(ctx, k, store.ForgetOptions{Force: c.req.Force, Audit: c.audit()}); err != nil {
				return answerOf(err)
			}
			return nil, nil
		},
	})
	if err != nil {
		return nil, err
	}
	return &adminv1.ForgetKeysResponse{Batch: batch}, nil
}

// SettleKeys settles the keys a selection matches, a page at a time, as
// SettleKey settles one.
func (s *Server) SettleKeys(ctx context.Context, req *adminv1.SettleKeysRequest) (*adminv1.SettleKeysResponse, error) {
	st := req.GetStatus()
	batch, err := s.run(ctx, bulk{
		method: settleKeys, sel: req.GetSelection(), limit: req.GetLimit(), dryRun: req.GetDryRun(),
		force: req.GetForce(), reason: req.GetReason(), pageToken: req.GetPageToken(),
		check: func() error {
			if _, err := store.SettleOutcome(st); err != nil {
				return invalid("%v", err)
			}
			return nil
		},
		act: func(ctx context.Context, c *call, k store.Scope) (error, error) {
			if err := s.st.Settle(ctx, k, st, store.SettleOptions{Force: c.req.Force, Audit: c.audit()}); err != nil {
				return answerOf(err)
			}
			return nil, nil
		},
	})
	if err != nil {
		return nil, err
	}
	return &adminv1.SettleKeysResponse{Batch: batch}, nil
}

// FinishKeys finishes the keys a selection matches, a page at a time, as
// FinishKey finishes one, through the server's finisher.
func (s *Server) FinishKeys(ctx context.Context, req *adminv1.FinishKeysRequest) (*adminv1.FinishKeysResponse, error) {
	batch, err := s.run(ctx, bulk{
		method: finishKeys, sel: req.GetSelection(), limit: req.GetLimit(), dryRun: req.GetDryRun(),
		reason: req.GetReason(), pageToken: req.GetPageToken(),
		check: func() error {
			if s.finisher == nil {
				return answerf(code.Code_UNIMPLEMENTED, "this server has no finisher to finish calls with (admin.WithFinisher)")
			}
			return nil
		},
		act: func(ctx context.Context, c *call, k store.Scope) (error, error) {
			_, _, answer, cause := c.finish(ctx, k)
			return answer, cause
		},
	})
	if err != nil {
		return nil, err
	}
	return &adminv1.FinishKeysResponse{Batch: batch}, nil
}
