package interceptor

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transport"
)

// UnaryClientInterceptor returns a client interceptor that attaches an
// idempotency key ([idem.KeyHeader]) to each call of a keyed method, once
// per logical call: every retry made below it (go-grpc-middleware's retry
// interceptor placed after it in the chain, or grpc-go's own retryPolicy)
// carries the same key. Package idem's documentation, "Calling other services", gives the rules:
// which methods are keyed, and which key each call gets.
//
// When the key is idem's and the method's request has an empty field marked
// (idem.v1.field).key (a request_id), the key also goes in that field, as
// AIP-4235 has client libraries fill it: the interceptor sends a copy of
// the request with the field set, and the caller's message is left as it
// is. grpc-go's retries resend that copy's bytes, so every attempt carries
// the same field and metadata.
//
// When the key is one the interceptor made for the call (a new one, or the
// child key of a request marked as a first attempt), it also marks the
// call as the key's first attempt, with metadata [idem.AttemptHeader] 1
// (unless the caller set that metadata itself), so that a method in
// idem.ModeAuto claims it without reading first. The retries below it
// send that mark again, and their own beside it (grpc-go's retryPolicy
// grpc-previous-rpc-attempts, go-grpc-middleware's x-retry-attempt),
// which the server takes over the first attempt's. A key the caller chose
// gets no mark: the call may be a retry of the caller's own.
//
// Streaming calls are not intercepted: idem's server interceptor handles
// unary calls only, so a stream's metadata passes through untouched.
func UnaryClientInterceptor(opts ...idem.ClientOption) grpc.UnaryClientInterceptor {
	k := transport.NewOutgoingKeys(opts...)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, opts = trackAttempts(ctx, opts)
		md, _ := metadata.FromOutgoingContext(ctx)
		sent := md.Get(idem.KeyHeader)
		send, keys, first, err := k.For(ctx, method, req, sent)
		if err != nil {
			var ie *idem.Error
			if errors.As(err, &ie) {
				return status.ErrorProto(ie.Status())
			}
			return err
		}
		mark := first && len(md.Get(idem.AttemptHeader)) == 0
		if !slices.Equal(keys, sent) || mark {
			md = md.Copy()
			if len(keys) == 0 {
				md.Delete(idem.KeyHeader)
			} else {
				md.Set(idem.KeyHeader, keys...)
			}
			if mark {
				md.Set(idem.AttemptHeader, "1")
			}
			ctx = metadata.NewOutgoingContext(ctx, md)
		}
		return invoker(ctx, method, send, reply, cc, opts...)
	}
}
