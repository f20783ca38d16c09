package admin

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

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
	service     = "/idem.admin.v1.AdminService/"
	listKeys    = service + "ListKeys"
	getKey      = service + "GetKey"
	forgetKey   = service + "ForgetKey"
	settleKey   = service + "SettleKey"
	finishKey   = service + "FinishKey"
	listAudit   = service + "ListAudit"
	getKeyStats = service + "GetKeyStats"
)

// RequestIDHeader is the request header whose value the audit trail keeps
// as the request id of the call that asked for an action
// ([store.AuditEntry].RequestID): the first one, cut to
// [store.MaxAuditFieldLength] bytes.
const RequestIDHeader = "x-request-id"

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
	r.Header, r.TLS, r.Peer = caller.Header, caller.TLS, caller.Peer
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
	if err := grant.refusal(r); err != nil {
		return ctx, nil, c.end(ctx, err, nil)
	}
	return ctx, c, nil
}

// refusal returns the PERMISSION_DENIED answer to r that g refuses, or nil
// when g allows r.
func (g Grant) refusal(r Request) error {
	switch {
	case g.ReadOnly && !ReadOnlyMethod(r.Method):
		return answerf(code.Code_PERMISSION_DENIED, "the operator's grant is read-only: it lists and reads keys, never acts on them")
	case r.AllTenants && !g.AllTenants:
		return answerf(code.Code_PERMISSION_DENIED, "listing every tenant's keys is not allowed; name a tenant")
	case !r.AllTenants && !g.Allows(r.Tenant):
		return answerf(code.Code_PERMISSION_DENIED, "tenant %q is not allowed", r.Tenant)
	}
	return nil
}

// allowed reports whether the Authorizer and the grant it returns would
// allow r, asked by the caller in ctx, as begin decides, without making
// the call: the console shows only the actions it would allow.
func (s *Server) allowed(ctx context.Context, r Request) bool {
	caller := adminwire.FromContext(ctx)
	r.Header, r.TLS, r.Peer = caller.Header, caller.TLS, caller.Peer
	g, err := s.authorize.Authorize(ctx, r)
	return err == nil && g.refusal(r) == nil
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
	case ReadOnlyMethod(c.req.Method):
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
	if c.req.Reason != "" {
		attrs = append(attrs, slog.String("reason", c.req.Reason))
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
	answer, cause := answerOf(err)
	return c.end(ctx, answer, cause)
}

// answerOf returns the service's answer to err, a store's error, and the
// error behind it to log (nil when the answer says it all).
func answerOf(err error) (answer, cause error) {
	var live *store.LeaseLiveError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return answerf(code.Code_NOT_FOUND, "the store holds no entry for the key"), nil
	case errors.Is(err, store.ErrNotInProgress):
		return answerf(code.Code_FAILED_PRECONDITION, "the key's outcome is recorded already; forget the key instead"), nil
	case errors.As(err, &live):
		return answerf(code.Code_FAILED_PRECONDITION, "the key's lease is live until %s; set force to fence its holder", live.Until.UTC().Format(time.RFC3339Nano)), nil
	case errors.Is(err, store.ErrInvalidCursor):
		return answerf(code.Code_INVALID_ARGUMENT, "%v", errBadToken), err
	case errors.Is(err, store.ErrInvalidScope):
		return answerf(code.Code_INVALID_ARGUMENT, "invalid key"), err
	case errors.Is(err, store.ErrInvalidStatus):
		return invalid("%v", err), nil
	case errors.Is(err, store.ErrInvalidAudit):
		return invalid("%s", rule(err, store.ErrInvalidAudit)), err
	case errors.Is(err, context.Canceled):
		return answerf(code.Code_CANCELLED, "canceled"), err
	case errors.Is(err, context.DeadlineExceeded):
		return answerf(code.Code_DEADLINE_EXCEEDED, "deadline exceeded"), err
	}
	return answerf(code.Code_UNAVAILABLE, "the store failed; the server's log has the detail"), err
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

// rule returns the rule err names, without its sentinel's text.
func rule(err, sentinel error) string {
	return strings.TrimPrefix(err.Error(), sentinel.Error()+": ")
}

// keyRequest returns the Request of an RPC on one key.
func keyRequest(method, tenant, scope, key string, force bool, reason string) Request {
	return Request{Method: method, Tenant: tenant, Key: store.Scope{Tenant: tenant, Method: scope, Key: key}, Force: force, Reason: reason}
}

// checkAction checks the request of an action on one key: its key, and its
// reason, which a forced action must give. It returns an INVALID_ARGUMENT
// answer, or nil.
func checkAction(r Request) error {
	if err := r.Key.Validate(); err != nil {
		return invalid("%v", err)
	}
	if r.Force && strings.TrimSpace(r.Reason) == "" {
		return invalid("a forced action needs a reason, for the audit trail")
	}
	if err := store.ValidateReason(r.Reason); err != nil {
		return invalid("%s", rule(err, store.ErrInvalidAudit))
	}
	return nil
}

// audit returns the audit entry of the call's action: the operator, the
// reason and who asked. The fields the operator does not choose are made
// to fit the store's rules (cut to their bound, valid UTF-8 without a NUL
// byte), so that an odd subject or header never fails the action.
func (c *call) audit() *store.AuditEntry {
	requestID := ""
	if ids := c.req.Header[RequestIDHeader]; len(ids) > 0 {
		requestID = ids[0]
	}
	return &store.AuditEntry{
		Operator:  fit(c.grant.Subject),
		Reason:    c.req.Reason,
		RequestID: fit(requestID),
		Peer:      fit(c.req.Peer),
	}
}

// fit returns s as an audit entry's field can hold it: valid UTF-8 without
// a NUL byte, at most store.MaxAuditFieldLength bytes, cut at a rune.
func fit(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	for len(s) > store.MaxAuditFieldLength {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
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
	f.After, err = s.tokens.open(keyListing(f), req.GetPageToken())
	if err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	infos, next, err := s.st.Keys(ctx, f)
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	resp := &adminv1.ListKeysResponse{NextPageToken: s.tokens.seal(keyListing(f), next)}
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
	if err := timeRange(&f.CreatedAfter, &f.CreatedBefore, "created_after", req.GetCreatedAfter(), "created_before", req.GetCreatedBefore()); err != nil {
		return f, err
	}
	var err error
	f.Limit, err = pageSize(req.GetPageSize())
	return f, err
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
	r := keyRequest(getKey, req.GetTenant(), req.GetMethod(), req.GetKey(), false, "")
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
	r := keyRequest(forgetKey, req.GetTenant(), req.GetMethod(), req.GetKey(), req.GetForce(), req.GetReason())
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	if err := checkAction(r); err != nil {
		return nil, c.end(ctx, err, nil)
	}
	if err := s.st.Forget(ctx, r.Key, store.ForgetOptions{Force: r.Force, Audit: c.audit()}); err != nil {
		return nil, c.fail(ctx, err)
	}
	return &adminv1.ForgetKeyResponse{}, c.end(ctx, nil, nil)
}

// SettleKey records an error as the outcome of one key in progress. The
// error's code is not OK, nor one clients retry: [store.SettleOutcome]
// states the rule, which answers INVALID_ARGUMENT here.
func (s *Server) SettleKey(ctx context.Context, req *adminv1.SettleKeyRequest) (*adminv1.SettleKeyResponse, error) {
	r := keyRequest(settleKey, req.GetTenant(), req.GetMethod(), req.GetKey(), req.GetForce(), req.GetReason())
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	if err := checkAction(r); err != nil {
		return nil, c.end(ctx, err, nil)
	}
	// The store's rule, checked before the store is asked: a status it
	// cannot record is the caller's mistake.
	st := req.GetStatus()
	out, err := store.SettleOutcome(st)
	if err != nil {
		return nil, c.end(ctx, invalid("%v", err), nil)
	}
	if err := s.st.Settle(ctx, r.Key, st, store.SettleOptions{Force: r.Force, Audit: c.audit()}); err != nil {
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
	r := keyRequest(finishKey, req.GetTenant(), req.GetMethod(), req.GetKey(), false, req.GetReason())
	ctx, c, err := s.begin(ctx, r)
	if c == nil {
		return nil, err
	}
	if s.finisher == nil {
		return nil, c.end(ctx, answerf(code.Code_UNIMPLEMENTED, "this server has no finisher to finish calls with (admin.WithFinisher)"), nil)
	}
	if err := checkAction(r); err != nil {
		return nil, c.end(ctx, err, nil)
	}
	ki, kerr, answer, cause := c.finish(ctx, r.Key)
	if answer != nil {
		return nil, c.end(ctx, answer, cause)
	}
	if kerr != nil {
		// Finished, but not read back (forgotten since, say).
		return nil, c.fail(ctx, kerr)
	}
	return &adminv1.FinishKeyResponse{Key: s.key(ctx, ki)}, c.end(ctx, nil, nil)
}

// finish finishes k's abandoned call through the server's finisher and,
// when it did, adds the finish's audit entry and reads the key back (ki,
// or kerr when it cannot be read). answer is the service's answer when it
// did not, and cause the error behind it to log.
func (c *call) finish(ctx context.Context, k store.Scope) (ki store.KeyInfo, kerr, answer, cause error) {
	s := c.s
	if answer, cause := finishAnswer(s.finisher.FinishKey(ctx, k)); answer != nil {
		return ki, nil, answer, cause
	}
	ki, kerr = s.st.Key(ctx, k)
	// The finish's audit entry, in a transaction of its own: the outcome
	// was recorded by the call's own transaction, the handler's. Written
	// after it, it may be lost to a crash between, never written for a
	// finish that did not happen.
	e := c.audit()
	e.Scope, e.Action, e.Before, e.After = k, store.ActionFinish, store.Abandoned, store.Recorded
	if kerr == nil {
		e.After = ki.State
	}
	if err := s.st.AddAudit(ctx, *e); err != nil {
		s.log().LogAttrs(ctx, slog.LevelError, "idem admin: the audit entry of a finish could not be written",
			slog.String("tenant", k.Tenant), slog.String("method", k.Method), slog.String("key", k.Key), slog.String("error", err.Error()))
	}
	return ki, kerr, nil, nil
}

// finishAnswer returns the service's answer to err, the error of the
// finisher's FinishKey (nil for nil), and the error behind it to log.
func finishAnswer(err error) (answer, cause error) {
	var (
		live *store.LeaseLiveError
		ie   *idem.Error
	)
	switch {
	case err == nil:
		return nil, nil
	case errors.Is(err, idem.ErrNotFinishable):
		return answerf(code.Code_FAILED_PRECONDITION, "nothing was kept to finish the call: its method does not opt in to finish ((idem.v1.method).finish); settle or forget the key instead"), nil
	case errors.Is(err, store.ErrNotInProgress):
		return answerf(code.Code_FAILED_PRECONDITION, "the key's outcome is recorded already: there is nothing to finish"), nil
	case errors.As(err, &live):
		return answerf(code.Code_FAILED_PRECONDITION, "the key's lease is live until %s: its call may still record an outcome; finish it once the lease has run out", live.Until.UTC().Format(time.RFC3339Nano)), nil
	case errors.As(err, &ie):
		// The attempt's answer (the call taken over first, its method not
		// registered, or the handler's transient error): the call is left
		// to the finisher.
		st := ie.Status()
		return answerf(code.Code(st.GetCode()), "the attempt to finish the call recorded no outcome; the finisher tries again later: %s", st.GetMessage()), err
	}
	if st, ok := adminwire.Status(err); ok && st.GetCode() != int32(code.Code_UNKNOWN) {
		// The handler's own status (a gRPC status, a *connect.Error), as
		// the call's client would have got it.
		return answerf(code.Code(st.GetCode()), "the attempt to finish the call recorded no outcome; the finisher tries again later: %s", st.GetMessage()), err
	}
	return answerOf(err)
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
