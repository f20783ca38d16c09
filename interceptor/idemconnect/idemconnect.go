package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/adminwire"
	"github.com/idemkit/idem/internal/retryhint"
	"github.com/idemkit/idem/transport"
)

// NewInterceptor returns a handler interceptor that runs each keyed unary
// call through e, once per key, and replays its recorded outcome to
// retries, as interceptor.UnaryServerInterceptor does for grpc-go: a call
// over Connect, gRPC or gRPC-Web and its retry over another transport,
// served by engines on the same store, are one operation.
//
// The key is read from the request header Idempotency-Key: on Connect and
// gRPC-Web as the IETF draft writes it (a quoted Structured Field String,
// or a bare token; see [transport.ParseHTTPKey]), on gRPC as metadata
// idempotency-key carries it, as it is. The tenant resolver
// ([idem.WithTenant]) gets the request headers as gRPC metadata would
// carry them (lower-case names, -bin values decoded), so that one resolver
// serves grpc-go and connect-go alike.
//
// Streaming calls carry no key: one that does is refused with
// INVALID_ARGUMENT. Used on a client, it does nothing.
func NewInterceptor(e *idem.Engine) connect.Interceptor {
	return &handlerInterceptor{engine: e}
}

type handlerInterceptor struct {
	engine *idem.Engine
}

func (i *handlerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i *handlerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if len(conn.RequestHeader().Values(idem.HTTPKeyHeader)) > 0 {
			return connectError(transport.StreamKeyRefused(conn.Spec().Procedure).Status())
		}
		return next(ctx, conn)
	}
}

func (i *handlerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		return serve(ctx, i.engine, req.Spec().Procedure, req, next)
	}
}

// serve runs req, a call of procedure, through e, with next as its
// handler, and maps the answer to Connect.
func serve(ctx context.Context, e *idem.Engine, procedure string, req connect.AnyRequest, next connect.UnaryFunc) (connect.AnyResponse, error) {
	protocol := req.Peer().Protocol
	keys, malformed := requestKeys(req.Header(), protocol)
	header := toMetadata(req.Header())
	if keys != nil {
		header[idem.KeyHeader] = keys
	}
	msg, _ := req.Any().(proto.Message)
	call := transport.Call{Method: procedure, Keys: keys, KeyError: malformed, Request: msg, Header: header, Status: connectStatus}

	// What the handler returned, when it ran. The handler's closure reaches
	// the engine through a function variable, so it and the variables it
	// writes live on the heap: one variable is one object there, not two.
	var ran struct {
		resp connect.AnyResponse // the handler's response
		herr error               // the handler's error, as it returned it
	}
	ans, err := transport.Handle(ctx, e, call, func(ctx context.Context) (transport.Reply, error) {
		ran.resp, ran.herr = next(ctx, req)
		resp, herr := ran.resp, ran.herr
		r := transport.Reply{}
		if herr != nil {
			var ce *connect.Error
			if errors.As(herr, &ce) {
				r.Header = toMetadata(ce.Meta())
			}
			return r, herr
		}
		r.Header = toMetadata(resp.Header())
		r.Trailer = toMetadata(resp.Trailer())
		if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
			r.Header = join(r.Header, toMetadata(info.ResponseHeader()))
			r.Trailer = join(r.Trailer, toMetadata(info.ResponseTrailer()))
		}
		if r.Message, _ = resp.Any().(proto.Message); r.Message == nil {
			return r, connect.NewError(connect.CodeInternal, fmt.Errorf("idem: response is %T, not a protobuf message", resp.Any()))
		}
		return r, nil
	})
	if err == nil && ans.Message == nil {
		err = connect.NewError(connect.CodeInternal, errors.New("idem: no response message to send"))
	}
	if err != nil {
		return nil, errorOf(err, ran.herr, ans, protocol)
	}
	return responseOf(ans, ran.resp, binaryProto(req)), nil
}

// join returns the entries of a and b together.
func join(a, b map[string][]string) map[string][]string {
	if len(b) == 0 {
		return a
	}
	if a == nil {
		a = make(map[string][]string, len(b))
	}
	for k, v := range b {
		a[k] = append(a[k], v...)
	}
	return a
}

// requestKeys returns the idempotency keys of a request with header h over
// protocol, decoded, or why one of them cannot be decoded. Idempotency-Key
// and idempotency-key are one header field (HTTP names are
// case-insensitive), so a request carries at most one list of values, which
// no precedence needs to order: more than one value, alike or not, is
// refused, as on grpc-go.
func requestKeys(h http.Header, protocol string) ([]string, error) {
	values := h.Values(idem.HTTPKeyHeader)
	if len(values) == 0 || protocol == connect.ProtocolGRPC {
		return values, nil // gRPC metadata: the value is the key
	}
	keys := make([]string, len(values))
	for n, v := range values {
		k, err := transport.ParseHTTPKey(v)
		if err != nil {
			return nil, err
		}
		keys[n] = k
	}
	return keys, nil
}

// toMetadata returns h as gRPC metadata: lower-case names, and the values
// of names ending in -bin decoded from base64 (a value that does not decode
// is kept as it is): adminwire.Metadata, the mapping the admin service's
// console shares.
func toMetadata(h http.Header) map[string][]string {
	return adminwire.Metadata(h)
}

// addMetadata adds md to h, encoding the values of names ending in -bin.
func addMetadata(h http.Header, md map[string][]string) {
	for name, values := range md {
		for _, v := range values {
			if strings.HasSuffix(name, "-bin") {
				v = connect.EncodeBinaryHeader([]byte(v))
			}
			h.Add(name, v)
		}
	}
}

// responseOf returns the response to send for ans: the handler's own, resp,
// when ans answers with its message, else a new one carrying resp's
// metadata, if any. binary tells a binary protobuf codec, which must send
// the message as it was recorded ([transport.Answer.WireMessage]).
func responseOf(ans transport.Answer, resp connect.AnyResponse, binary bool) connect.AnyResponse {
	msg := ans.Message
	if binary {
		msg = ans.WireMessage()
	}
	out := resp
	if resp == nil || resp.Any() != any(msg) {
		out = connect.NewResponse(&message{msg})
		if resp != nil {
			mergeHeader(out.Header(), resp.Header())
			mergeHeader(out.Trailer(), resp.Trailer())
		}
	}
	addMetadata(out.Header(), ans.Header)
	addMetadata(out.Trailer(), ans.Trailer)
	return out
}

// message is a response message of idem's (a replayed one, or recorded
// bytes): [connect.NewResponse] needs the concrete type of a message, which
// an interceptor does not know, so it wraps it, and codecs, which take any
// [proto.Message], reach it through ProtoReflect. Interceptors placed
// outside idem's see this type, not the method's response type, on replays.
type message struct{ proto.Message }

func mergeHeader(dst, src http.Header) {
	for name, values := range src {
		dst[name] = append(dst[name], values...)
	}
}

// binaryProto reports whether the response to req is encoded with the
// binary protobuf codec, which sends recorded bytes as they are; JSON and
// other codecs encode the decoded message.
func binaryProto(req connect.AnyRequest) bool {
	if req.Peer().Protocol == connect.ProtocolConnect && req.HTTPMethod() == http.MethodGet {
		return req.Peer().Query.Get("encoding") == "proto"
	}
	ct, _, _ := strings.Cut(req.Header().Get("Content-Type"), ";")
	switch strings.ToLower(strings.TrimSpace(ct)) {
	case "application/proto", // Connect
		"application/grpc", "application/grpc+proto",
		"application/grpc-web", "application/grpc-web+proto":
		return true
	}
	return false
}

// errorOf returns err, the handler's own error herr (nil when the handler
// did not fail) or idem's answer, as the error to send, with the metadata
// of ans. The handler's own error goes as it is when there is nothing to
// add. Over the Connect protocol an error with a RetryInfo also carries
// RFC 9110's Retry-After, which the IETF draft answers a key in use with,
// for plain HTTP clients: the handler's as well as idem's, so that a
// recorded error and its replays say the same.
func errorOf(err, herr error, ans transport.Answer, protocol string) error {
	ie, idems := idemsAnswer(err, herr)
	st := statusOf(err)
	if idems {
		st = ie.Status()
	}
	retryAfter := ""
	if protocol == connect.ProtocolConnect {
		retryAfter = retryAfterOf(st)
	}
	if !idems && len(ans.Header) == 0 && len(ans.Trailer) == 0 && retryAfter == "" {
		return err
	}
	ce := connectError(st)
	var hce *connect.Error
	if !idems && errors.As(err, &hce) {
		mergeHeader(ce.Meta(), hce.Meta())
	}
	addMetadata(ce.Meta(), ans.Header)
	addMetadata(ce.Meta(), ans.Trailer)
	if retryAfter != "" {
		ce.Meta().Set("Retry-After", retryAfter)
	}
	return ce
}

// idemsAnswer returns err, which Handle returned, as idem's answer, and
// whether it is one rather than the handler's own error herr: a handler's
// error that wraps an *idem.Error (one a handler got from idem's outgoing
// keys, say) is still the handler's, sent and recorded with the handler's
// status. Handle returns the handler's error as it is, and its own answers
// after the handler ran unwrapped.
func idemsAnswer(err, herr error) (*idem.Error, bool) {
	if ie, ok := err.(*idem.Error); ok && err != herr {
		return ie, true
	}
	if herr != nil {
		return nil, false
	}
	var ie *idem.Error
	return ie, errors.As(err, &ie)
}

// retryAfterOf returns the delay of the RetryInfo in st as the value of a
// Retry-After header: whole seconds, rounded up; "" when st has none.
func retryAfterOf(st *spb.Status) string {
	d, ok := retryhint.Delay(st)
	if !ok {
		return ""
	}
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// connectError returns st as a *connect.Error with the same code, message
// and details.
func connectError(st *spb.Status) *connect.Error {
	ce := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, d := range st.GetDetails() {
		if ed, err := connect.NewErrorDetail(d); err == nil {
			ce.AddDetail(ed)
		}
	}
	return ce
}

// statusOf returns err, a handler's error, as a google.rpc.Status: a
// *connect.Error with its code, message and details, a context error as
// its code, anything else as UNKNOWN.
func statusOf(err error) *spb.Status {
	var ce *connect.Error
	if errors.As(err, &ce) {
		p := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
		for _, d := range ce.Details() {
			p.Details = append(p.Details, detailAny(d))
		}
		return p
	}
	c := connect.CodeUnknown
	switch {
	case errors.Is(err, context.Canceled):
		c = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		c = connect.CodeDeadlineExceeded
	}
	return &spb.Status{Code: int32(c), Message: err.Error()}
}

// connectStatus reads the status of an error as connect-go sends it: a
// *connect.Error's, or a context error's code.
func connectStatus(err error) (*spb.Status, bool) {
	var ce *connect.Error
	st := statusOf(err)
	if !errors.As(err, &ce) && st.GetCode() == int32(connect.CodeUnknown) {
		return nil, false
	}
	return st, true
}

// detailAny returns d as the google.protobuf.Any of a google.rpc.Status.
func detailAny(d *connect.ErrorDetail) *anypb.Any {
	return &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()}
}
