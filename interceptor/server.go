package interceptor

import (
	"bytes"
	"context"
	"errors"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idem/fingerprint"
	"github.com/idemkit/idem/store"
)

var logger = grpclog.Component("idem")

// UnaryServerInterceptor returns a server interceptor that runs each keyed
// unary call once per key and replays its recorded outcome to retries. See
// the package documentation for the flow and the status codes.
func UnaryServerInterceptor(s store.Store, opts ...Option) grpc.UnaryServerInterceptor {
	o := evaluateOptions(opts)
	i := &server{
		store:  s,
		opts:   o,
		hasher: fingerprint.NewHasher(o.fingerprint...),
		methods: &methods{
			files: protoregistry.GlobalFiles,
			types: protoregistry.GlobalTypes,
		},
	}
	return i.intercept
}

type server struct {
	store   store.Store
	opts    *options
	hasher  *fingerprint.Hasher
	methods *methods
}

func (i *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m := i.methods.lookup(info.FullMethod)
	if m.exempt {
		return handler(ctx, req)
	}
	key, ok, err := keyFromMetadata(ctx)
	if err != nil {
		return nil, invalidKey(err.Error())
	}
	if !ok {
		if m.required {
			return nil, invalidKey("required by " + info.FullMethod)
		}
		return handler(ctx, req)
	}
	if m.output == nil {
		return nil, status.Errorf(codes.Internal, "idem: %s is not in the protobuf registry, so its responses cannot be replayed", info.FullMethod)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idem: request of %s is %T, not a protobuf message", info.FullMethod, req)
	}
	tenant, err := i.opts.tenant.Tenant(ctx)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	fp, err := i.hasher.Sum(msg)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "idem: "+err.Error())
	}

	claim, err := i.store.Claim(ctx, store.Key{Tenant: tenant, Method: info.FullMethod, Key: key}, fp)
	if err != nil {
		return nil, storeError(err, i.opts.retryDelay)
	}
	if claim.Entry != nil {
		return i.replay(ctx, m, info.FullMethod, fp, claim.Entry)
	}
	return i.execute(withRequestKey(ctx, key), req, m, handler, claim.Txn)
}

// execute runs the handler inside the claim and records its outcome. A
// panic releases the claim and continues up the chain.
func (i *server) execute(ctx context.Context, req any, m *method, handler grpc.UnaryHandler, txn store.Txn) (any, error) {
	defer func() { _ = txn.Release(ctx) }()

	resp, herr := handler(txn.Context(ctx), req)
	if herr != nil {
		st := status.Convert(herr)
		if !i.opts.classifier.Deterministic(st) {
			return nil, herr // transient: the deferred Release rolls back
		}
		body, err := proto.Marshal(st.Proto())
		if err != nil {
			return nil, status.Errorf(codes.Internal, "idem: recording the error: %v", err)
		}
		if err := txn.Complete(ctx, store.Outcome{Code: st.Code(), Body: body}); err != nil {
			return nil, storeError(err, i.opts.retryDelay)
		}
		return nil, st.Err()
	}
	msg, ok := resp.(proto.Message)
	if !ok || msg == nil {
		return nil, status.Errorf(codes.Internal, "idem: response is %T, not a protobuf message", resp)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idem: recording the response: %v", err)
	}
	if err := txn.Complete(ctx, store.Outcome{Code: codes.OK, Body: body}); err != nil {
		return nil, storeError(err, i.opts.retryDelay)
	}
	if m.raw {
		return rawMessage(m, body), nil
	}
	return resp, nil
}

// replay answers a request whose key another request took.
func (i *server) replay(ctx context.Context, m *method, fullMethod string, fp []byte, e *store.Entry) (any, error) {
	if !bytes.Equal(e.Fingerprint, fp) {
		return nil, keyReused()
	}
	if e.State != store.Completed {
		return nil, keyInUse(i.opts.retryDelay)
	}
	resp, err := decode(m, e.Outcome)
	if err != nil {
		logger.Errorf("%s: recorded outcome cannot be replayed: %v", fullMethod, err)
		return nil, status.Error(codes.Internal, "idem: the recorded outcome of this request is unreadable")
	}
	// SetHeader fails only outside a gRPC server; the header is a courtesy.
	_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
	if e.Outcome.Code != codes.OK {
		return nil, status.ErrorProto(resp.(*spb.Status))
	}
	return resp, nil
}

// decode checks a recorded outcome and returns the message to hand back:
// the response, or the google.rpc.Status of an error.
func decode(m *method, out store.Outcome) (proto.Message, error) {
	if out.Code != codes.OK {
		st := new(spb.Status)
		if err := proto.Unmarshal(out.Body, st); err != nil {
			return nil, err
		}
		if codes.Code(st.GetCode()) != out.Code || out.Code == codes.OK {
			return nil, errors.New("recorded status code does not match its row")
		}
		return st, nil
	}
	resp := m.output.New().Interface()
	if err := proto.Unmarshal(out.Body, resp); err != nil {
		return nil, err
	}
	if m.raw {
		return rawMessage(m, out.Body), nil
	}
	return resp, nil
}

// rawMessage returns an empty response whose unknown fields are body, so that
// gRPC's codec sends body as it is.
func rawMessage(m *method, body []byte) proto.Message {
	r := m.output.New()
	r.SetUnknown(body)
	return r.Interface()
}
