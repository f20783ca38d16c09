package idemconnect

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store"
)

// NewInterceptor returns a handler interceptor that runs each keyed unary
// call once per key and replays its recorded outcome to retries, as
// [interceptor.UnaryServerInterceptor] does for grpc-go, with the same
// options, through the same [interceptor.Engine]: a call over Connect,
// gRPC or gRPC-Web and its retry over another transport, served on the
// same store, are one operation.
//
// The key is read from the request header Idempotency-Key: on Connect and
// gRPC-Web as the IETF draft writes it (a quoted Structured Field String,
// or a bare token; see [interceptor.ParseHTTPKey]), on gRPC as metadata
// idempotency-key carries it, as it is. Before idem runs, the request
// headers are put into the context as incoming gRPC metadata (lower-case
// names, -bin values decoded), so that one [interceptor.TenantFunc] reading
// metadata.FromIncomingContext serves grpc-go and connect-go alike.
//
// Streaming calls carry no key: one that does is refused with
// INVALID_ARGUMENT. Used on a client, it does nothing.
func NewInterceptor(s store.Store, opts ...interceptor.ServerOption) connect.Interceptor {
	return &handlerInterceptor{engine: interceptor.NewEngine(s, opts...)}
}

type handlerInterceptor struct {
	engine *interceptor.Engine
}

func (i *handlerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i *handlerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if len(conn.RequestHeader().Values(interceptor.HTTPKeyHeader)) > 0 {
			return streamKeyRefused(conn.Spec().Procedure)
		}
		return next(ctx, conn)
	}
}

// streamKeyRefused is the error of a streaming call that carries a key.
func streamKeyRefused(procedure string) error {
	reason := "idempotency keys apply to unary methods; " + procedure + " is a streaming method"
	st, err := status.New(codes.InvalidArgument, "idem: "+reason).WithDetails(
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field:       interceptor.KeyHeader,
			Description: reason,
		}}},
		&errdetails.ErrorInfo{Reason: interceptor.ReasonKeyInvalid, Domain: interceptor.Domain})
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("idem: "+reason))
	}
	return connectError(st)
}

func (i *handlerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		keys, malformed := requestKeys(req.Header(), req.Peer().Protocol)
		ctx = withIncomingMetadata(ctx, req.Header(), keys)
		msg, _ := req.Any().(proto.Message)
		call := interceptor.Call{Method: req.Spec().Procedure, Keys: keys, Request: msg}

		var (
			resp    connect.AnyResponse // the handler's response, when it ran
			herr    error               // the handler's error, as it returned it
			hstatus *status.Status      // herr as a gRPC status
		)
		handler := func(ctx context.Context) (interceptor.Reply, error) {
			resp, herr = next(ctx, req)
			r := interceptor.Reply{}
			if herr != nil {
				hstatus = statusOf(herr)
				var ce *connect.Error
				if errors.As(herr, &ce) {
					r.Header = toMetadata(ce.Meta())
				}
				return r, hstatus.Err()
			}
			r.Header = toMetadata(resp.Header())
			r.Trailer = toMetadata(resp.Trailer())
			if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
				r.Header = metadata.Join(r.Header, toMetadata(info.ResponseHeader()))
				r.Trailer = metadata.Join(r.Trailer, toMetadata(info.ResponseTrailer()))
			}
			if r.Message, _ = resp.Any().(proto.Message); r.Message == nil {
				return r, status.Errorf(codes.Internal, "idem: response is %T, not a protobuf message", resp.Any())
			}
			return r, nil
		}
		var (
			ans interceptor.Answer
			err error
		)
		if malformed != nil {
			ans, err = i.engine.HandleMalformedKey(ctx, call, malformed, handler)
		} else {
			ans, err = i.engine.Handle(ctx, call, handler)
		}
		if err == nil && ans.Message == nil {
			err = status.Error(codes.Internal, "idem: no response message to send")
		}
		if err != nil {
			return nil, errorOf(err, ans, herr, hstatus, req.Peer().Protocol)
		}
		return responseOf(ans, resp, binaryProto(req)), nil
	}
}

// requestKeys returns the idempotency keys of a request with header h over
// protocol, decoded, or why one of them cannot be decoded. Idempotency-Key
// and idempotency-key are one header field (HTTP names are
// case-insensitive), so a request carries at most one list of values, which
// no precedence needs to order: more than one value, alike or not, is
// refused, as on grpc-go.
func requestKeys(h http.Header, protocol string) ([]string, error) {
	values := h.Values(interceptor.HTTPKeyHeader)
	if len(values) == 0 || protocol == connect.ProtocolGRPC {
		return values, nil // gRPC metadata: the value is the key
	}
	keys := make([]string, len(values))
	for n, v := range values {
		k, err := interceptor.ParseHTTPKey(v)
		if err != nil {
			return nil, err
		}
		keys[n] = k
	}
	return keys, nil
}

// withIncomingMetadata returns ctx with the request header h as incoming
// gRPC metadata, as grpc-go would hand it to a handler: lower-case names,
// values of -bin names decoded, and the idempotency key as keys, decoded
// (nil: as h has it, which is then malformed).
func withIncomingMetadata(ctx context.Context, h http.Header, keys []string) context.Context {
	md := toMetadata(h)
	if keys != nil {
		md.Set(interceptor.KeyHeader, keys...)
	}
	return metadata.NewIncomingContext(ctx, md)
}

// toMetadata returns h as gRPC metadata: lower-case names, and the values
// of names ending in -bin decoded from base64 (a value that does not decode
// is kept as it is).
func toMetadata(h http.Header) metadata.MD {
	md := make(metadata.MD, len(h))
	for name, values := range h {
		name = strings.ToLower(name)
		for _, v := range values {
			if strings.HasSuffix(name, "-bin") {
				if b, err := connect.DecodeBinaryHeader(v); err == nil {
					v = string(b)
				}
			}
			md[name] = append(md[name], v)
		}
	}
	return md
}

// addMetadata adds md to h, encoding the values of names ending in -bin.
func addMetadata(h http.Header, md metadata.MD) {
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
// the message as it was recorded ([interceptor.Answer.WireMessage]).
func responseOf(ans interceptor.Answer, resp connect.AnyResponse, binary bool) connect.AnyResponse {
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

// errorOf returns err, a gRPC status error of idem's or of the handler,
// as the *connect.Error to send, with the metadata of ans. The handler's
// own error (herr, whose status is hstatus) goes as it is when there is no
// metadata to add.
func errorOf(err error, ans interceptor.Answer, herr error, hstatus *status.Status, protocol string) error {
	st := status.Convert(err)
	handlers := herr != nil && proto.Equal(st.Proto(), hstatus.Proto())
	retryAfter := protocol == connect.ProtocolConnect && retryDelay(st) != ""
	if handlers && len(ans.Header) == 0 && len(ans.Trailer) == 0 && !retryAfter {
		return herr
	}
	ce := connectError(st)
	var hce *connect.Error
	if handlers && errors.As(herr, &hce) {
		mergeHeader(ce.Meta(), hce.Meta())
	}
	addMetadata(ce.Meta(), ans.Header)
	addMetadata(ce.Meta(), ans.Trailer)
	if retryAfter {
		// RFC 9110's Retry-After, which the IETF draft answers a key in
		// use with, for HTTP clients of the Connect protocol.
		ce.Meta().Set("Retry-After", retryDelay(st))
	}
	return ce
}

// retryDelay returns the delay of the RetryInfo in st in whole seconds,
// rounded up, for a Retry-After header; "" when st has none.
func retryDelay(st *status.Status) string {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			d := max(ri.GetRetryDelay().AsDuration(), 0)
			return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
		}
	}
	return ""
}

// connectError returns st as a *connect.Error with the same code, message
// and details.
func connectError(st *status.Status) *connect.Error {
	ce := connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
	for _, d := range st.Proto().GetDetails() {
		if ed, err := connect.NewErrorDetail(d); err == nil {
			ce.AddDetail(ed)
		}
	}
	return ce
}

// statusOf returns err, a handler's error, as a gRPC status: a
// *connect.Error with its code, message and details, a status error as it
// is, a context error as its code, anything else as UNKNOWN.
func statusOf(err error) *status.Status {
	var ce *connect.Error
	if errors.As(err, &ce) {
		p := status.New(codes.Code(ce.Code()), ce.Message()).Proto()
		for _, d := range ce.Details() {
			p.Details = append(p.Details, detailAny(d))
		}
		return status.FromProto(p)
	}
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// detailAny returns d as the google.protobuf.Any of a google.rpc.Status.
func detailAny(d *connect.ErrorDetail) *anypb.Any {
	return &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()}
}
