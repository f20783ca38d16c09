package admin

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemkit/idem"
	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/internal/adminwire"
	"github.com/idemkit/idem/store"
)

// instrumentationScope names the service's tracer.
const instrumentationScope = "github.com/idemkit/idem/admin"

// The full names of the service's RPCs, as [Request.Method] holds them.
const (
	service   = "/idem.admin.v1.AdminService/"
	listKeys  = service + "ListKeys"
	getKey    = service + "GetKey"
	forgetKey = service + "ForgetKey"
	settleKey = service + "SettleKey"
	finishKey = service + "FinishKey"
)

// Server is idem.admin.v1.AdminService over a [store.Admin], with no
// transport: its methods are the service's RPCs, which
// interceptor.RegisterAdmin serves over gRPC and idemconnect.NewAdminHandler
// over Connect (it implements adminv1connect.AdminServiceHandler). They
// return nil or an [*idem.Error], the service's answer, or an Authorizer's
// own error.
type Server struct {
	st        store.Admin
	authorize Authorizer
	tokens    tokens
	logger    *slog.Logger
	tracer    trace.Tracer
	methods   methods
	finisher  *idem.Finisher
}

// NewServer returns the admin service over st, which authorize guards. It
// panics when st or authorize is nil, or when [WithPageTokenKey] gives a
// key shorter than 32 bytes: there is no default that would let anyone
// in.
func NewServer(st store.Admin, authorize Authorizer, opts ...Option) *Server {
	if st == nil {
		panic("admin: NewServer needs a store.Admin")
	}
	if authorize == nil {
		panic("admin: NewServer needs an Authorizer: the admin service lets whoever reaches it forget and settle keys, so it has no default that lets anyone in")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.tokenKey == nil {
		o.tokenKey = make([]byte, minTokenKeyLength)
		rand.Read(o.tokenKey) // never fails (crypto/rand)
	} else if len(o.tokenKey) < minTokenKeyLength {
		panic(fmt.Sprintf("admin: WithPageTokenKey's key is %d bytes, shorter than the %d needed", len(o.tokenKey), minTokenKeyLength))
	}
	tp := o.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Server{
		st:        st,
		authorize: authorize,
		tokens:    tokens{key: o.tokenKey},
		logger:    o.logger,
		tracer:    tp.Tracer(instrumentationScope),
		finisher:  o.finisher,
	}
}

func (s *Server) log() *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return slog.Default()
}

// call is one call of the service as it runs: what was asked, by whom, and
// the span it runs in.
type call struct {
	s     *Server
	req   Request
	grant Grant
	span  trace.Span
}

// begin starts the span of the call r and authorizes it. On success, it
// returns the context to run the call in; the caller ends the call with
// c.end. On refusal, it ends the call itself and returns the answer.
func (s *Server) begin(ctx context.Context, r Request) (context.Context, *call, error) {
	caller := adminwire.FromContext(ctx)
	r.Header, r.TLS = caller.Header, caller.TLS
	ctx, span := s.tracer.Start(ctx, "idem.admin."+strings.TrimPrefix(r.Method, service),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("rpc.method", r.Method[1:])))
	c := &call{s: s, req: r, span: span}
	grant, err := s.authorize.Authorize(ctx, r)
	if err != nil {
		if st, ok := adminwire.Status(err); ok && st.GetCode() != int32(code.Code_OK) && st.GetCode() != int32(code.Code_UNKNOWN) {
			// The authorizer's own answer, which its wire sends as it is.
			return ctx, nil, c.end(ctx, err, err)
		}
		return ctx, nil, c.end(ctx, answerf(code.Code_PERMISSION_DENIED, "permission denied"), err)
	}
	c.grant = grant
	span.SetAttributes(attribute.String("idem.admin.subject", grant.Subject))
	switch {
	case r.AllTenants && !grant.AllTenants:
		return ctx, nil, c.end(ctx, answerf(code.Code_PERMISSION_DENIED, "listing every tenant's keys is not allowed; name a tenant"), nil)
	case !r.AllTenants && !grant.Allows(r.Tenant):
		return ctx, nil, c.end(ctx, answerf(code.Code_PERMISSION_DENIED, "tenant %q is not allowed", r.Tenant), nil)
	}
	return ctx, c, nil
}

// end ends the call with answer (nil for success), logs it, and returns
// answer. cause is the error behind it, logged and never sent.
func (c *call) end(ctx context.Context, answer, cause error) error {
	cd := code.Code_OK
	if answer != nil {
		cd = code.Code_UNKNOWN
		msg := answer.Error()
		if st, ok := adminwire.Status(answer); ok {
			cd, msg = code.Code(st.GetCode()), st.GetMessage()
		}
		c.span.SetStatus(otelcodes.Error, msg)
	}
	c.span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(cd)))
	c.span.End()
	level := slog.LevelInfo
	switch {
	case cd == code.Code_PERMISSION_DENIED || cd == code.Code_UNAUTHENTICATED:
		level = slog.LevelWarn
	case cd == code.Code_UNAVAILABLE || cd == code.Code_INTERNAL:
		level = slog.LevelError
	case c.req.Method == listKeys || c.req.Method == getKey:
		level = slog.LevelDebug
	}
	attrs := []slog.Attr{
		slog.String("subject", c.grant.Subject),
		slog.String("rpc", c.req.Method),
		slog.String("tenant", c.req.Tenant),
	}
	if c.req.AllTenants {
		attrs = append(attrs, slog.Bool("all_tenants", true))
	}
	if c.req.Key.Key != "" || c.req.Key.Method != "" {
		attrs = append(attrs, slog.String("method", c.req.Key.Method), slog.String("key", c.req.Key.Key))
	}
	if c.req.Force {
		attrs = append(attrs, slog.Bool("force", true))
	}
	attrs = append(attrs, slog.String("code", cd.String()))
	if cause != nil {
		attrs = append(attrs, slog.String("error", cause.Error()))
	}
	c.s.log().LogAttrs(ctx, level, "idem admin call", attrs...)
	return answer
}

// fail ends the call with the answer to err, a store's error.
func (c *call) fail(ctx context.Context, err error) error {
	var live *store.LeaseLiveError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return c.end(ctx, answerf(code.Code_NOT_FOUND, "the store holds no entry for the key"), nil)
	case errors.Is(err, store.ErrNotInProgress):
		return c.end(ctx, answerf(code.Code_FAILED_PRECONDITION, "the key's outcome is recorded already; forget the key instead"), nil)
	case errors.As(err, &live):
		return c.end(ctx, answerf(code.Code_FAILED_PRECONDITION, "the key's lease is live until %s; set force to fence its holder", live.Until.UTC().Format(time.RFC3339Nano)), nil)
	case errors.Is(err, store.ErrInvalidCursor):
		return c.end(ctx, answerf(code.Code_INVALID_ARGUMENT, "%v", errBadToken), err)
	case errors.Is(err, store.ErrInvalidScope):
		return c.end(ctx, answerf(code.Code_INVALID_ARGUMENT, "invalid key"), err)
	case errors.Is(err, store.ErrInvalidStatus):
		return c.end(ctx, invalid("%v", err), nil)
	case errors.Is(err, context.Canceled):
		return c.end(ctx, answerf(code.Code_CANCELLED, "canceled"), err)
	case errors.Is(err, context.DeadlineExceeded):
		return c.end(ctx, answerf(code.Code_DEADLINE_EXCEEDED, "deadline exceeded"), err)
	}
	return c.end(ctx, answerf(code.Code_UNAVAILABLE, "the store failed; the server's log has the detail"), err)
}

// answerf returns the service's answer with code c and the message
// "idem admin: " and format's text: an [*idem.Error], which each wire's
// adapter sends as its status.
func answerf(c code.Code, format string, args ...any) error {
	return idem.NewError(c, "idem admin: "+fmt.Sprintf(format, args...))
}

func invalid(format string, args ...any) error {
	return answerf(code.Code_INVALID_ARGUMENT, format, args...)
}

// keyRequest returns the Request of an RPC on one key.
func keyRequest(method, tenant, scope, key string, force bool) Request {
	return Request{Method: method, Tenant: tenant, Key: store.Scope{Tenant: tenant, Method: scope, Key: key}, Force: force}
}

// ListKeys lists the keys that match the request's filter, a page at a
// time.
func (s *Server) ListKeys(ctx context.Context, req *adminv1.ListKeysRequest) (*adminv1.ListKeysResponse, error) {
	r := Request{Method: listKeys, Tenant: req.GetTenant(), AllTenants: req.GetAllTenants()}
	if r.AllTenants {
		r.Tenant = ""
	}
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	f, err := filter(req)
	if err != nil {
		return nil, c.end(ctx, err, nil)
	}
	f.After, err = s.tokens.open(f, req.GetPageToken())
	if err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	infos, next, err := s.st.Keys(ctx, f)
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	resp := &adminv1.ListKeysResponse{NextPageToken: s.tokens.seal(f, next)}
	for _, ki := range infos {
		if !c.grant.Allows(ki.Scope.Tenant) {
			// The store answered outside the filter: show nothing of it.
			return nil, c.fail(ctx, fmt.Errorf("the store listed a key of tenant %q for a filter of tenant %q", ki.Scope.Tenant, f.Tenant))
		}
		resp.Keys = append(resp.Keys, s.key(ctx, ki))
	}
	return resp, c.end(ctx, nil, nil)
}

// filter returns the store's filter of req, or an INVALID_ARGUMENT answer.
func filter(req *adminv1.ListKeysRequest) (store.KeyFilter, error) {
	f := store.KeyFilter{Tenant: req.GetTenant(), AllTenants: req.GetAllTenants(), Method: req.GetMethod()}
	if f.AllTenants && f.Tenant != "" {
		return f, invalid("tenant must be empty with all_tenants")
	}
	if err := f.Validate(); err != nil {
		// A filter no key can hold (a NUL byte, say): refused as GetKey
		// refuses such a key, before the store is asked.
		return f, invalid("%v", err)
	}
	for _, st := range req.GetStates() {
		ks, ok := keyStates[st]
		if !ok {
			return f, invalid("states holds %v, which is not a state to list", st)
		}
		f.States = append(f.States, ks)
	}
	for _, t := range []struct {
		name string
		ts   *timestamppb.Timestamp
		to   *time.Time
	}{{"created_after", req.GetCreatedAfter(), &f.CreatedAfter}, {"created_before", req.GetCreatedBefore(), &f.CreatedBefore}} {
		if t.ts == nil {
			continue
		}
		if err := t.ts.CheckValid(); err != nil {
			return f, invalid("%s is not a valid timestamp", t.name)
		}
		*t.to = t.ts.AsTime()
	}
	switch n := req.GetPageSize(); {
	case n < 0:
		return f, invalid("page_size is negative")
	case n > 1000:
		f.Limit = 1000
	default:
		f.Limit = int(n)
	}
	return f, nil
}

var keyStates = map[adminv1.KeyState]store.State{
	adminv1.KeyState_KEY_STATE_IN_PROGRESS: store.InProgress,
	adminv1.KeyState_KEY_STATE_ABANDONED:   store.Abandoned,
	adminv1.KeyState_KEY_STATE_RECORDED:    store.Recorded,
	adminv1.KeyState_KEY_STATE_EXPIRED:     store.Expired,
}

var protoStates = map[store.State]adminv1.KeyState{
	store.InProgress: adminv1.KeyState_KEY_STATE_IN_PROGRESS,
	store.Abandoned:  adminv1.KeyState_KEY_STATE_ABANDONED,
	store.Recorded:   adminv1.KeyState_KEY_STATE_RECORDED,
	store.Expired:    adminv1.KeyState_KEY_STATE_EXPIRED,
}

// GetKey returns everything kept of one key.
func (s *Server) GetKey(ctx context.Context, req *adminv1.GetKeyRequest) (*adminv1.GetKeyResponse, error) {
	r := keyRequest(getKey, req.GetTenant(), req.GetMethod(), req.GetKey(), false)
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	if err := r.Key.Validate(); err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	ki, err := s.st.Key(ctx, r.Key)
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	return &adminv1.GetKeyResponse{Key: s.key(ctx, ki)}, c.end(ctx, nil, nil)
}

// ForgetKey deletes one key's entry.
func (s *Server) ForgetKey(ctx context.Context, req *adminv1.ForgetKeyRequest) (*adminv1.ForgetKeyResponse, error) {
	r := keyRequest(forgetKey, req.GetTenant(), req.GetMethod(), req.GetKey(), req.GetForce())
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	if err := r.Key.Validate(); err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	if err := s.st.Forget(ctx, r.Key, store.ForgetOptions{Force: r.Force}); err != nil {
		return nil, c.fail(ctx, err)
	}
	return &adminv1.ForgetKeyResponse{}, c.end(ctx, nil, nil)
}

// SettleKey records an error as the outcome of one key in progress. The
// error's code is not OK, nor one clients retry: [store.SettleOutcome]
// states the rule, which answers INVALID_ARGUMENT here.
func (s *Server) SettleKey(ctx context.Context, req *adminv1.SettleKeyRequest) (*adminv1.SettleKeyResponse, error) {
	r := keyRequest(settleKey, req.GetTenant(), req.GetMethod(), req.GetKey(), req.GetForce())
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	if err := r.Key.Validate(); err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	// The store's rule, checked before the store is asked: a status it
	// cannot record is the caller's mistake.
	st := req.GetStatus()
	out, err := store.SettleOutcome(st)
	if err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	if err := s.st.Settle(ctx, r.Key, st, store.SettleOptions{Force: r.Force}); err != nil {
		return nil, c.fail(ctx, err)
	}
	ki, err := s.st.Key(ctx, r.Key)
	if err != nil {
		// Settled, but not read back (forgotten since, say): answer with
		// what was settled rather than an error a retry would not clear.
		s.log().LogAttrs(ctx, slog.LevelWarn, "idem admin: a settled key could not be read back",
			slog.String("tenant", r.Key.Tenant), slog.String("method", r.Key.Method), slog.String("key", r.Key.Key), slog.String("error", err.Error()))
		ki = store.KeyInfo{Scope: r.Key, State: store.Recorded, Outcome: &out}
	}
	return &adminv1.SettleKeyResponse{Key: s.key(ctx, ki)}, c.end(ctx, nil, nil)
}

// FinishKey finishes one abandoned call now, through the server's
// finisher.
func (s *Server) FinishKey(ctx context.Context, req *adminv1.FinishKeyRequest) (*adminv1.FinishKeyResponse, error) {
	r := keyRequest(finishKey, req.GetTenant(), req.GetMethod(), req.GetKey(), false)
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	if s.finisher == nil {
		return nil, c.end(ctx, answerf(code.Code_UNIMPLEMENTED, "this server has no finisher to finish calls with (admin.WithFinisher)"), nil)
	}
	if err := r.Key.Validate(); err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	err = s.finisher.FinishKey(ctx, r.Key)
	var (
		live *store.LeaseLiveError
		ie   *idem.Error
	)
	switch {
	case err == nil:
	case errors.Is(err, idem.ErrNotFinishable):
		return nil, c.end(ctx, answerf(code.Code_FAILED_PRECONDITION, "nothing was kept to finish the call: its method does not opt in to finish ((idem.v1.method).finish); settle or forget the key instead"), nil)
	case errors.Is(err, store.ErrNotInProgress):
		return nil, c.end(ctx, answerf(code.Code_FAILED_PRECONDITION, "the key's outcome is recorded already: there is nothing to finish"), nil)
	case errors.As(err, &live):
		return nil, c.end(ctx, answerf(code.Code_FAILED_PRECONDITION, "the key's lease is live until %s: its call may still record an outcome; finish it once the lease has run out", live.Until.UTC().Format(time.RFC3339Nano)), nil)
	case errors.As(err, &ie):
		// The attempt's answer (the call taken over first, its method not
		// registered, or the handler's transient error): the call is left
		// to the finisher.
		st := ie.Status()
		return nil, c.end(ctx, answerf(code.Code(st.GetCode()), "the attempt to finish the call recorded no outcome; the finisher tries again later: %s", st.GetMessage()), err)
	default:
		if st, ok := adminwire.Status(err); ok && st.GetCode() != int32(code.Code_UNKNOWN) {
			// The handler's own status (a gRPC status, a *connect.Error),
			// as the call's client would have got it.
			return nil, c.end(ctx, answerf(code.Code(st.GetCode()), "the attempt to finish the call recorded no outcome; the finisher tries again later: %s", st.GetMessage()), err)
		}
		return nil, c.fail(ctx, err)
	}
	ki, err := s.st.Key(ctx, r.Key)
	if err != nil {
		// Finished, but not read back (forgotten since, say).
		return nil, c.fail(ctx, err)
	}
	return &adminv1.FinishKeyResponse{Key: s.key(ctx, ki)}, c.end(ctx, nil, nil)
}

// key returns ki as the service shows it.
func (s *Server) key(ctx context.Context, ki store.KeyInfo) *adminv1.Key {
	ts := func(t time.Time) *timestamppb.Timestamp {
		if t.IsZero() {
			return nil
		}
		return timestamppb.New(t)
	}
	k := &adminv1.Key{
		Tenant:          ki.Scope.Tenant,
		Method:          ki.Scope.Method,
		Key:             ki.Scope.Key,
		State:           protoStates[ki.State],
		Fingerprint:     ki.Fingerprint,
		CreateTime:      ts(ki.CreatedAt),
		UpdateTime:      ts(ki.UpdatedAt),
		ExpireTime:      ts(ki.ExpiresAt),
		LeaseExpireTime: ts(ki.LeaseUntil),
		Takeovers:       int32(ki.Takeovers),
		Finishable:      ki.Call != nil,
		Replays:         ki.Replays,
		LastReplayTime:  ts(ki.LastReplay),
	}
	for _, p := range ki.Steps {
		k.Steps = append(k.Steps, &adminv1.Step{Name: p.Name, Result: p.Result})
	}
	if ki.Outcome != nil {
		out, err := s.outcome(ki.Scope.Method, ki.Outcome)
		if err != nil {
			s.log().LogAttrs(ctx, slog.LevelWarn, "idem admin: a recorded outcome cannot be decoded",
				slog.String("tenant", ki.Scope.Tenant), slog.String("method", ki.Scope.Method), slog.String("key", ki.Scope.Key), slog.String("error", err.Error()))
		}
		k.Outcome = out
	}
	req, err := s.request(ki)
	if err != nil {
		s.log().LogAttrs(ctx, slog.LevelWarn, "idem admin: a kept request cannot be decoded",
			slog.String("tenant", ki.Scope.Tenant), slog.String("method", ki.Scope.Method), slog.String("key", ki.Scope.Key), slog.String("error", err.Error()))
	}
	k.Request = req
	return k
}
