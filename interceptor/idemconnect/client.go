package idemconnect

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"slices"

	"connectrpc.com/connect"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transport"
)

// NewClientInterceptor returns a client interceptor that attaches an
// idempotency key to each call of a keyed method, once per logical call,
// as [github.com/idemkit/idem/interceptor.UnaryClientInterceptor] does for
// grpc-go, with the same options and rules (package idem's documentation, "Calling
// other services"): a new UUIDv7 outside a handler, a key derived from the
// request's inside a keyed handler ([idem.ChildKey]), the key set with [idem.ContextWithKey], or
// the caller's own header; never the key of the request being handled. A request that carries its key in
// its field marked (idem.v1.field).key (a request_id) gets no key of idem's:
// the field's is the call's key, on every attempt. When that field is empty
// and the key is idem's, the key also goes in the field (as AIP-4235 has
// client libraries fill a request_id): the interceptor sends a copy of the
// message with the field set, in the request's Msg for the duration of the
// call, and puts the caller's message back when the call returns.
// Interceptors placed after it ([NewRetryInterceptor]) send every attempt
// with the same key, in the header and in the field; placed after a
// NewRetryInterceptor, it attaches to each attempt the key of the first.
//
// The key goes in the request header Idempotency-Key: on Connect and
// gRPC-Web as a Structured Field String, as the IETF draft writes it
// ([transport.FormatHTTPKey]); on gRPC as it is, as metadata
// idempotency-key, which a grpc-go server with idem's interceptor reads as
// it is. The two are one HTTP header field, so a call carries one of them,
// never both. Keys the caller set in the header are read the same way. (A
// gRPC-Web proxy in front of a grpc-go server hands that server the quoted
// form, which it takes as the key itself: the same on every retry through
// the proxy, but not the key of a direct gRPC call with the same value.)
//
// When the key is one the interceptor made for the call (a new one, or the
// child key of a request marked as a first attempt), it also marks the
// call as the key's first attempt, with the header Idempotency-Attempt: 1
// ([idem.HTTPAttemptHeader]), unless the caller set that header itself,
// so that a method in idem.ModeAuto claims it without reading first. A
// [NewRetryInterceptor] numbers its attempts after the first in the same
// header, in place of that mark. A key the caller chose gets no mark: the
// call may be a retry of the caller's own.
//
// Streaming calls are not intercepted. Used on a handler, it does nothing.
func NewClientInterceptor(opts ...idem.ClientOption) connect.Interceptor {
	return &clientInterceptor{keys: transport.NewOutgoingKeys(opts...)}
}

type clientInterceptor struct {
	keys *transport.OutgoingKeys
}

func (c *clientInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			return next(ctx, req)
		}
		protocol := req.Peer().Protocol
		h := req.Header()
		values := slices.Clone(h.Values(idem.HTTPKeyHeader))
		sent := values
		if protocol != connect.ProtocolGRPC && len(values) > 0 {
			sent = make([]string, len(values))
			for n, v := range values {
				k, err := transport.ParseHTTPKey(v)
				if err != nil {
					k = v // malformed: compared, and sent, as it is
				}
				sent[n] = k
			}
		}
		send, keys, first, err := c.keysFor(ctx, req, sent)
		if err != nil {
			var ie *idem.Error
			if errors.As(err, &ie) {
				return nil, connectError(ie.Status())
			}
			return nil, err
		}
		// The request may be sent again, as another logical call: leave it
		// as the caller made it.
		if send != req.Any() {
			if restore, ok := setMessage(req, send); ok {
				defer restore()
			}
		}
		if first && len(h.Values(idem.HTTPAttemptHeader)) == 0 {
			h.Set(idem.HTTPAttemptHeader, "1")
			defer h.Del(idem.HTTPAttemptHeader)
		}
		if slices.Equal(keys, sent) {
			return next(ctx, req)
		}
		setKeys(h, keys, protocol)
		defer setValues(h, values)
		return next(ctx, req)
	}
}

// keysFor returns the message to send for req and its keys, given the keys
// sent, as [transport.OutgoingKeys.For] decides them once per logical call: an
// attempt of a [NewRetryInterceptor] placed before this interceptor sends
// what the call's first attempt sent.
func (c *clientInterceptor) keysFor(ctx context.Context, req connect.AnyRequest, sent []string) (any, []string, bool, error) {
	p, _ := ctx.Value(pinCtxKey{}).(*pin)
	if p != nil && p.req == req && p.set {
		return p.send, p.keys, p.first, nil
	}
	send, keys, first, err := c.keys.For(ctx, req.Spec().Procedure, req.Any(), sent)
	if err == nil && p != nil && p.req == req {
		p.set, p.send, p.keys, p.first = true, send, keys, first
	}
	return send, keys, first, err
}

// setMessage makes msg the message that req sends, and returns a function
// that puts req's own message back; it reports false, changing nothing,
// when req is not a *connect.Request of msg's type. connect-go gives an
// interceptor no other way to send a message of its own: the message is the
// exported field Msg of the generic connect.Request[T], which code that
// sees only a connect.AnyRequest cannot name, so this sets it through
// reflection. Should it fail, the call still carries its key in the header.
func setMessage(req connect.AnyRequest, msg any) (restore func(), ok bool) {
	v := reflect.ValueOf(req)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, false
	}
	f := v.Elem().FieldByName("Msg")
	m := reflect.ValueOf(msg)
	if !f.IsValid() || !f.CanSet() || !m.IsValid() || m.Type() != f.Type() {
		return nil, false
	}
	own := reflect.New(f.Type()).Elem()
	own.Set(f)
	f.Set(m)
	return func() { f.Set(own) }, true
}

func (c *clientInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (c *clientInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// setKeys sets the key header of h to keys, in the syntax of protocol.
func setKeys(h http.Header, keys []string, protocol string) {
	values := keys
	if protocol != connect.ProtocolGRPC {
		values = make([]string, len(keys))
		for n, k := range keys {
			values[n] = transport.FormatHTTPKey(k)
		}
	}
	setValues(h, values)
}

// setValues sets the values of the key header of h.
func setValues(h http.Header, values []string) {
	h.Del(idem.HTTPKeyHeader)
	for _, v := range values {
		h.Add(idem.HTTPKeyHeader, v)
	}
}
