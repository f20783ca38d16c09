package interceptor_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/transport"
)

func TestHandleKeyError(t *testing.T) {
	rec := &hookRecorder{}
	e := idemtest.NewEngine(t, memory.New(), idem.WithReportHook(rec.hook))
	ran := 0
	h := func(context.Context) (transport.Reply, error) {
		ran++
		return transport.Reply{Message: &testv1.ReadResponse{Value: "v"}}, nil
	}
	reason := errors.New("the quoted key has no closing double quote")

	call := transport.Call{Method: testv1.TestService_Do_FullMethodName, KeyError: reason, Request: &testv1.DoRequest{Value: "v"}}
	_, err := transport.Handle(t.Context(), e, call, h)
	st := wantCode(t, grpcError(err), codes.InvalidArgument)
	var violation *errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
			violation = br.GetFieldViolations()[0]
		}
	}
	if violation.GetField() != idem.KeyHeader || violation.GetDescription() != reason.Error() {
		t.Errorf("violation %v, want one on %s saying %q", violation, idem.KeyHeader, reason)
	}
	if ran != 0 {
		t.Errorf("the handler ran %d times for a malformed key", ran)
	}
	if got := rec.take(); len(got) != 1 || got[0].Result != idem.ResultInvalidKey {
		t.Errorf("the hook saw %+v, want one invalid_key", got)
	}

	// A method without side effects ignores a well-formed key, not a
	// malformed one.
	call = transport.Call{Method: testv1.TestService_Read_FullMethodName, KeyError: reason, Request: &testv1.ReadRequest{Value: "v"}}
	_, err = transport.Handle(t.Context(), e, call, h)
	wantCode(t, grpcError(err), codes.InvalidArgument)
	if ran != 0 {
		t.Fatalf("exempt method: the handler ran %d times for a malformed key", ran)
	}
	if got := rec.take(); len(got) != 1 || got[0].Result != idem.ResultInvalidKey {
		t.Errorf("the hook saw %+v, want one invalid_key", got)
	}
}

func TestOutgoingKeys(t *testing.T) {
	k := transport.NewOutgoingKeys()
	ctx := t.Context()
	do, read, maybe := testv1.TestService_Do_FullMethodName, testv1.TestService_Read_FullMethodName, testv1.TestService_Maybe_FullMethodName

	_, keys, err := k.For(ctx, do, nil, nil)
	if err != nil || len(keys) != 1 {
		t.Fatalf("keyed method: %v, %v; want one new key", keys, err)
	}
	if u, err := uuid.Parse(keys[0]); err != nil || u.Version() != 7 {
		t.Errorf("new key %q is not a UUIDv7", keys[0])
	}
	for _, c := range []struct {
		name   string
		ctx    context.Context
		method string
		sent   []string
		want   []string
	}{
		{"the caller's own key", ctx, do, []string{"mine"}, []string{"mine"}},
		{"no side effects", ctx, read, nil, nil},
		{"optional key", ctx, maybe, nil, nil},
		{"ContextWithKey", idem.ContextWithKey(ctx, "set"), do, []string{"mine"}, []string{"set"}},
		{"ContextWithKey, optional key", idem.ContextWithKey(ctx, "set"), maybe, nil, []string{"set"}},
	} {
		_, got, err := k.For(c.ctx, c.method, nil, c.sent)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	_, _, err = k.For(idem.ContextWithKey(ctx, "a b"), do, nil, nil)
	wantCode(t, grpcError(err), codes.InvalidArgument)

	// Inside a keyed handler: a child key, and never the request's own key.
	e := idemtest.NewEngine(t, memory.New())
	var inside [][]string
	call := transport.Call{Method: do, Keys: []string{"parent"}, Request: &testv1.DoRequest{Value: "v"}}
	_, err = transport.Handle(ctx, e, call, func(ctx context.Context) (transport.Reply, error) {
		for _, c := range []struct {
			method string
			sent   []string
		}{{do, nil}, {do, []string{"parent"}}, {read, []string{"parent", "other"}}} {
			_, keys, err := k.For(ctx, c.method, nil, c.sent)
			if err != nil {
				return transport.Reply{}, err
			}
			inside = append(inside, keys)
		}
		return transport.Reply{Message: &testv1.DoResponse{}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	parent := store.Scope{Method: do, Key: "parent"}
	want := [][]string{
		{idemtest.CallKey(parent, do, 1)},
		{idemtest.CallKey(parent, do, 2)},
		{"other"},
	}
	if !slices.EqualFunc(inside, want, slices.Equal) {
		t.Errorf("keys inside the handler %q, want %q", inside, want)
	}
}
