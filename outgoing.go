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

// outgoingKeys decides the idempotency key of each outgoing call, for the
// client adapters of every transport (transport.OutgoingKeys), by the rules
// of the package documentation, "Calling other services". It is safe for
// concurrent use.
type outgoingKeys struct {
	keyed   func(context.Context, string) bool
	methods *methods
	obs     *clientObserver
}

// newOutgoingKeys returns the outgoingKeys of a client configured with
// opts.
func newOutgoingKeys(opts ...ClientOption) *outgoingKeys {
	o := evaluateClientOptions(opts)
	return &outgoingKeys{
		keyed:   o.keyed,
		methods: newMethods(nil),
		obs:     newClientObserver(o),
	}
}

// keysFor returns the request to send for a call of fullMethod made with
// ctx and the request message req, and the idempotency keys it carries,
// given the keys sent, which the caller put on the call itself: it is
// transport.OutgoingKeys.For, whose documentation says what it decides.
func (k *outgoingKeys) keysFor(ctx context.Context, fullMethod string, req any, sent []string) (send any, keys []string, first bool, err error) {
	m := k.methods.lookup(fullMethod)
	msg, field := keyField(m, req)
	own := "" // the key req carries in its field
	if field != nil {
		own = msg.Get(field).String()
	}
	// A request that carries the key of the request being handled (a
	// handler that sends on the message it was sent) carries none: that
	// key is never forwarded.
	parent, inHandler := requestKey(ctx)
	forwarded := own != "" && inHandler && own == parent.Key
	if forwarded {
		own = ""
	}
	key, src, err := k.keyOf(ctx, m, fullMethod, own, sent)
	if err != nil {
		return req, nil, false, err
	}
	k.obs.keyed(ctx, fullMethod, src)
	if field != nil && (key != "" || forwarded) {
		c := proto.Clone(msg.Interface()).ProtoReflect()
		if key != "" {
			c.Set(field, protoreflect.ValueOfString(key))
		} else {
			c.Clear(field)
		}
		req = c.Interface()
	}
	if key != "" {
		return req, []string{key}, firstOf(ctx, src), nil
	}
	if inHandler && slices.Contains(sent, parent.Key) {
		return req, slices.DeleteFunc(slices.Clone(sent), func(v string) bool { return v == parent.Key }), false, nil
	}
	return req, sent, false, nil
}

// firstOf reports whether a call made with ctx whose key came from src is
// the first of its key: a new key's is; a child key's is when its parent
// request was marked as a first attempt (a retried parent sends its
// children's keys again); the caller's may be a retry's.
func firstOf(ctx context.Context, src keySource) bool {
	switch src {
	case sourceGenerated:
		return true
	case sourceDerived:
		calls, _ := ctx.Value(callsCtxKey{}).(*callCounter)
		return calls != nil && attemptOf(calls.header) == firstAttempt
	}
	return false
}

// keyOf returns the key to send with a call of method m (named method)
// whose request carries the key own in its field marked (idem.v1.field).key
// ("" when it has none, or it is empty) and the keys sent; or "" to send no
// key of idem's: sent then goes as it is, less the request's own key. It
// also says where the call's key comes from, "" when it carries none.
func (k *outgoingKeys) keyOf(ctx context.Context, m *method, method, own string, sent []string) (string, keySource, error) {
	if m.exempt {
		return "", "", nil
	}
	if own != "" {
		return "", sourceCaller, nil // the request's own field carries it
	}
	if key, ok := ctx.Value(outgoingKeyCtxKey{}).(string); ok {
		if err := validateKey(key); err != nil {
			return "", "", NewError(code.Code_INVALID_ARGUMENT, "idem: key set with ContextWithKey: "+err.Error())
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
		return "", "", NewError(code.Code_INTERNAL, "idem: generating a key: "+err.Error())
	}
	return u.String(), sourceGenerated, nil
}

// keyField returns req as a message and its field that carries the key of
// method m, the string field marked (idem.v1.field).key; nil and nil when m
// has none, or req is not m's request.
func keyField(m *method, req any) (protoreflect.Message, protoreflect.FieldDescriptor) {
	msg, ok := req.(proto.Message)
	if m.keyField == nil || !ok || msg == nil {
		return nil, nil
	}
	r := msg.ProtoReflect()
	if !r.IsValid() {
		return nil, nil // a typed nil
	}
	fd := r.Descriptor().Fields().ByNumber(m.keyField.Number())
	if r.Descriptor().FullName() != m.keyField.ContainingMessage().FullName() ||
		fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
		return nil, nil
	}
	return r, fd
}

// derive returns the child key of the request parent for the next call of
// method.
func derive(ctx context.Context, parent store.Scope, method string) (string, error) {
	if step, ok := stepFromContext(ctx); ok {
		return stepKey(parent, step), nil
	}
	calls, ok := ctx.Value(callsCtxKey{}).(*callCounter)
	if !ok {
		return "", NewError(code.Code_INTERNAL, "idem: the context holds a request key but no call counter; "+
			"keyed requests must be set up by the engine")
	}
	return callKey(parent, method, calls.next(method)), nil
}

// callCounter numbers a keyed request's outbound calls per method. It
// keeps the request's metadata, whose attempt mark its children's keys
// inherit (firstOf).
type callCounter struct {
	mu     sync.Mutex
	n      map[string]int
	header map[string][]string
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
// keys, and a fresh counter of outbound calls for the client adapters'
// ordinals, with the request's metadata header. Every path of the engine
// that runs a handler under a key goes through it.
func withRequestKey(ctx context.Context, key store.Scope, header map[string][]string) context.Context {
	ctx = context.WithValue(ctx, keyCtxKey{}, key)
	return context.WithValue(ctx, callsCtxKey{}, &callCounter{header: header})
}

type outgoingKeyCtxKey struct{}

// ContextWithKey returns a context whose calls through idem's client
// adapters carry key, to keyed and optional-key methods alike (IDEMPOTENT
// and NO_SIDE_EFFECTS methods still get none). Use it when the key comes from
// elsewhere, such as an id the caller stored before a crash, so that the
// call after a restart repeats the one before it. An invalid key fails the
// call with INVALID_ARGUMENT before it is sent.
//
// The key is sent as it is, also inside a keyed handler; there, send a key
// derived from the request's, its [ChildKey] for a step named for the call.
func ContextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, outgoingKeyCtxKey{}, key)
}

type stepCtxKey struct{}

// withStep returns ctx whose outgoing calls, inside a keyed handler, carry
// the child key of the step named step (stepKey), instead of being
// numbered per method: [Step] runs its function with it.
func withStep(ctx context.Context, step string) context.Context {
	return context.WithValue(ctx, stepCtxKey{}, step)
}

// stepFromContext returns the step set with withStep; it reports false
// when none is set.
func stepFromContext(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(stepCtxKey{}).(string)
	return s, ok && s != ""
}
