package idem

import (
	"context"
	"slices"
	"sync"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemkit/idem/store"
)

// OutgoingKeys decides the idempotency key of each outgoing call, for the
// client interceptors of every transport (interceptor.UnaryClientInterceptor,
// idemconnect.NewClientInterceptor): once per logical call, so that every
// retry made below the interceptor carries the same key. It is safe for
// concurrent use.
//
// A method is keyed when its descriptor says (idem.v1.method).key_required
// or [WithKeyedMethods] selects it; IDEMPOTENT and NO_SIDE_EFFECTS methods
// never are. The key is, in order of precedence:
//
//  0. the key the request carries in its field marked (idem.v1.field).key
//     (a request_id, as AIP-155 has it), when that field is set: it is the
//     call's key, on every retry, and idem attaches none of its own (the
//     caller's metadata goes as it is, less the key of the request being
//     handled). An empty field changes nothing;
//  1. the key set with [ContextWithKey], sent as it is (to optional-key
//     methods too);
//  2. a key the caller put in the outgoing metadata ([KeyHeader]), sent as
//     it is, unless it is the key of the request being handled, which is
//     never forwarded and is replaced as in 3;
//  3. inside a keyed handler (see [KeyFromContext]), a child key of the
//     request's tenant, method and key: [DeriveKey](request, step) for a
//     call made with the step name set with [ContextWithStep]; else the
//     hex-encoded SHA-256 of the request's tenant, method and key, "call",
//     the full method name called and the call's ordinal among this
//     request's calls to that method ("1" for the first, "2" for the
//     second), each part length-prefixed as DeriveKey writes them, so that
//     no step name, whatever it is, shares a key with a call's ordinal;
//  4. otherwise a new UUID (version 7, time-ordered, so that consecutive
//     keys land near each other in the server's index).
//
// The request's own key is never forwarded, on any method: a handler that
// copies its incoming metadata to its outgoing context sends a keyed method
// the child key, and an IDEMPOTENT, NO_SIDE_EFFECTS or unselected
// optional-key method no key at all.
type OutgoingKeys struct {
	keyed   func(context.Context, string) bool
	methods *methods
	obs     *clientObserver
}

// NewOutgoingKeys returns the OutgoingKeys of a client configured with
// opts.
func NewOutgoingKeys(opts ...ClientOption) *OutgoingKeys {
	o := evaluateClientOptions(opts)
	return &OutgoingKeys{
		keyed:   o.keyed,
		methods: newMethods(nil),
		obs:     newClientObserver(o),
	}
}

// For returns the idempotency keys a call of fullMethod made with ctx and
// the request message req carries, given the keys sent, which the caller
// put on the call itself (usually none): one key of idem's, or sent as it
// is, or sent less the key of the request being handled in ctx, which is
// never forwarded. When req carries its key in its field marked
// (idem.v1.field).key, For adds no key of idem's: the field's is the
// call's. The keys are values, decoded from their transport's syntax. An
// error is an [*Error] that fails the call before it is sent:
// INVALID_ARGUMENT for a key set with [ContextWithKey] that [ValidateKey]
// refuses. Each call of For with a key counts in the metric
// idem.client.keys (see [WithMeterProvider]): call it once per logical
// call.
func (k *OutgoingKeys) For(ctx context.Context, fullMethod string, req any, sent []string) ([]string, error) {
	key, src, err := k.keyFor(ctx, fullMethod, req, sent)
	if err != nil {
		return nil, err
	}
	k.obs.keyed(ctx, fullMethod, src)
	if key != "" {
		return []string{key}, nil
	}
	if parent, inHandler := requestKey(ctx); inHandler && slices.Contains(sent, parent.Key) {
		return slices.DeleteFunc(slices.Clone(sent), func(v string) bool { return v == parent.Key }), nil
	}
	return sent, nil
}

// keyFor returns the key to send with a call of method whose request is
// req and that carries the keys sent, or "" to send no key of idem's: sent
// then goes as it is, less the request's own key. It also says where the
// call's key comes from, "" when it carries none.
func (k *OutgoingKeys) keyFor(ctx context.Context, method string, req any, sent []string) (string, keySource, error) {
	m := k.methods.lookup(method)
	if m.exempt {
		return "", "", nil
	}
	if fieldKey(m, req) != "" {
		return "", sourceCaller, nil // the request's own field carries it
	}
	if key, ok := ctx.Value(outgoingKeyCtxKey{}).(string); ok {
		if err := ValidateKey(key); err != nil {
			return "", "", newError(code.Code_INVALID_ARGUMENT, "idem: key set with ContextWithKey: "+err.Error())
		}
		return key, sourceCaller, nil
	}
	parent, inHandler := requestKey(ctx)
	if len(sent) > 0 && !(inHandler && slices.Contains(sent, parent.Key)) {
		return "", sourceCaller, nil // the caller's own key
	}
	if !m.required && (k.keyed == nil || !k.keyed(ctx, method)) {
		return "", "", nil
	}
	if inHandler {
		key, err := derive(ctx, parent, method)
		return key, sourceDerived, err
	}
	u, err := uuid.NewV7()
	if err != nil {
		return "", "", newError(code.Code_INTERNAL, "idem: generating a key: "+err.Error())
	}
	return u.String(), sourceGenerated, nil
}

// fieldKey returns the key req carries in the field of method m marked
// (idem.v1.field).key; "" when it has none, or req is not m's request.
func fieldKey(m *method, req any) string {
	msg, ok := req.(proto.Message)
	if m.keyField == nil || !ok || msg == nil {
		return ""
	}
	r := msg.ProtoReflect()
	fd := r.Descriptor().Fields().ByNumber(m.keyField.Number())
	if r.Descriptor().FullName() != m.keyField.ContainingMessage().FullName() ||
		fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
		return ""
	}
	return r.Get(fd).String()
}

// derive returns the child key of the request parent for the next call of
// method.
func derive(ctx context.Context, parent store.Key, method string) (string, error) {
	if step, ok := stepFromContext(ctx); ok {
		return DeriveKey(parent, step), nil
	}
	calls, ok := ctx.Value(callsCtxKey{}).(*callCounter)
	if !ok {
		return "", newError(code.Code_INTERNAL, "idem: the context holds a request key but no call counter; "+
			"keyed requests must be set up by the server interceptor")
	}
	return callKey(parent, method, calls.next(method)), nil
}

// callCounter numbers a keyed request's outbound calls per method.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounter) next(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[method]++
	return c.n[method]
}

type callsCtxKey struct{}

// withRequestKey returns ctx marked as handling the keyed request key: it
// holds the key's scope for [KeyFromContext] and the derivation of child
// keys, and a fresh counter of outbound calls for the client interceptor's
// ordinals. Every path of the server interceptor that runs a handler under
// a key goes through it.
func withRequestKey(ctx context.Context, key store.Key) context.Context {
	ctx = context.WithValue(ctx, keyCtxKey{}, key)
	return context.WithValue(ctx, callsCtxKey{}, &callCounter{})
}

type outgoingKeyCtxKey struct{}

// ContextWithKey returns a context whose calls through idem's client
// interceptors carry key, to keyed and optional-key methods alike (IDEMPOTENT and
// NO_SIDE_EFFECTS methods still get none). Use it when the key comes from
// elsewhere, such as an id the caller stored before a crash, so that the
// call after a restart repeats the one before it. An invalid key fails the
// call with INVALID_ARGUMENT before it is sent.
//
// The key is sent as it is, also inside a keyed handler; there, prefer
// [ContextWithStep], which derives a distinct key from the request's.
func ContextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, outgoingKeyCtxKey{}, key)
}

type stepCtxKey struct{}

// ContextWithStep names the step of a keyed request that the calls made with the
// returned context perform. Inside a keyed handler their keys are
// [ChildKey](ctx, step), derived from the request's tenant, method and key,
// instead of being numbered per method. Name steps whenever the order of
// calls to one method can vary between executions of the handler, such as
// calls made concurrently: an ordinal would then hand a retried request's
// calls each other's keys.
//
// Calls made with the same step and method share a key, so the second is
// answered with the first's response: give each distinct operation its own
// step. An empty step removes the name.
func ContextWithStep(ctx context.Context, step string) context.Context {
	return context.WithValue(ctx, stepCtxKey{}, step)
}

// stepFromContext returns the step set with [ContextWithStep]; it reports false
// when none is set.
func stepFromContext(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(stepCtxKey{}).(string)
	return s, ok && s != ""
}
