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
//     handled). An empty field changes nothing, nor does one that holds the
//     key of the request being handled (a handler that sends on the
//     message it was sent), which is never forwarded;
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
// copies its incoming metadata to its outgoing context, or its request's key
// field to the request it sends, sends a keyed method the child key, and an
// IDEMPOTENT, NO_SIDE_EFFECTS or unselected optional-key method no key at
// all (in a copy of the request whose key field is cleared).
//
// # Filling the request's key field
//
// When the key is idem's (1, 3 or 4) and the method's request has a field
// marked (idem.v1.field).key that is empty (or holds the key of the request
// being handled), the key also goes in that field, as Google's client
// libraries fill a request_id (AIP-4235). The call carries it twice, in the
// field and in the metadata: idem's server accepts the two because they are
// the same, and a server or proxy that reads only one of them still reads
// the call's key. The field is set on a copy of the request (proto.Clone),
// which [OutgoingKeys.For] returns for the adapter to send. The caller's
// message is never changed: a message shared between goroutines is never
// written to, and one sent again, or used as a template for other calls,
// makes another logical call, with a key of its own (a filled field would
// silently make it a replay of the first). The retries below the adapter
// (grpc-go's retryPolicy, which resends the first attempt's bytes; a retry
// interceptor placed after idem's, which sends the same copy again) keep
// the filled key. A caller that retries by calling again, above the
// interceptor, sets the field (or [ContextWithKey]) itself, and keeps it.
//
// The key idem generates for the field is the UUIDv7 of 4, one key for
// both places: idem's server takes any key, and a version 7 UUID is a UUID
// to an API that asks for one. An API that declares its field
// (google.api.field_info).format = UUID4 and checks the version should
// have its callers fill the field.
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

// For returns the request to send for a call of fullMethod made with ctx
// and the request message req, and the idempotency keys it carries, given
// the keys sent, which the caller put on the call itself (usually none):
// one key of idem's, or sent as it is, or sent less the key of the request
// being handled in ctx, which is never forwarded. The request to send is
// req, or, when idem's key also goes in req's empty field marked
// (idem.v1.field).key, a copy of req with the field set (see "Filling the
// request's key field"); req is never changed. When req carries its key in
// that field, For adds no key of idem's: the field's is the call's. The
// keys are values, decoded from their transport's syntax. An error is an
// [*Error] that fails the call before it is sent: INVALID_ARGUMENT for a
// key set with [ContextWithKey] that [ValidateKey] refuses. Each call of
// For with a key counts in the metric idem.client.keys (see
// [WithMeterProvider]): call it once per logical call, and send the request
// it returns on every attempt.
func (k *OutgoingKeys) For(ctx context.Context, fullMethod string, req any, sent []string) (send any, keys []string, err error) {
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
	key, src, err := k.keyFor(ctx, m, fullMethod, own, sent)
	if err != nil {
		return req, nil, err
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
		return req, []string{key}, nil
	}
	if inHandler && slices.Contains(sent, parent.Key) {
		return req, slices.DeleteFunc(slices.Clone(sent), func(v string) bool { return v == parent.Key }), nil
	}
	return req, sent, nil
}

// keyFor returns the key to send with a call of method m (named method)
// whose request carries the key own in its field marked (idem.v1.field).key
// ("" when it has none, or it is empty) and the keys sent; or "" to send no
// key of idem's: sent then goes as it is, less the request's own key. It
// also says where the call's key comes from, "" when it carries none.
func (k *OutgoingKeys) keyFor(ctx context.Context, m *method, method, own string, sent []string) (string, keySource, error) {
	if m.exempt {
		return "", "", nil
	}
	if own != "" {
		return "", sourceCaller, nil // the request's own field carries it
	}
	if key, ok := ctx.Value(outgoingKeyCtxKey{}).(string); ok {
		if err := ValidateKey(key); err != nil {
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
		return DeriveKey(parent, step), nil
	}
	calls, ok := ctx.Value(callsCtxKey{}).(*callCounter)
	if !ok {
		return "", NewError(code.Code_INTERNAL, "idem: the context holds a request key but no call counter; "+
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
func withRequestKey(ctx context.Context, key store.Scope) context.Context {
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
