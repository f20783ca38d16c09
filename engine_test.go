package idem_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/transport"
)

// The engine's behaviour that needs no wire, on store/memory: the calls go
// to transport.Handle as an adapter makes them. What every adapter must
// carry over its wire is the transport conformance suite's
// (transport/transporttest).

const (
	doMethod    = testv1.TestService_Do_FullMethodName
	readMethod  = testv1.TestService_Read_FullMethodName
	maybeMethod = testv1.TestService_Maybe_FullMethodName
)

// wantRefusal fails the test unless err is an *idem.Error of code c, and
// returns it.
func wantRefusal(t *testing.T, err error, c code.Code) *idem.Error {
	t.Helper()
	var ie *idem.Error
	if !errors.As(err, &ie) || ie.Status().GetCode() != int32(c) {
		t.Fatalf("got %v, want an *idem.Error of code %v", err, c)
	}
	return ie
}

// keyViolation returns the BadRequest field violation on the key that e
// carries, nil if none.
func keyViolation(t *testing.T, e *idem.Error) *errdetails.BadRequest_FieldViolation {
	t.Helper()
	for _, a := range e.Status().GetDetails() {
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		if br, ok := m.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if v.GetField() == idem.KeyHeader {
					return v
				}
			}
		}
	}
	return nil
}

// counting is a transport.Handler that counts its runs and answers msg.
type counting struct {
	mu  sync.Mutex
	ran int
}

func (c *counting) handler(msg func() transport.Reply) transport.Handler {
	return func(context.Context) (transport.Reply, error) {
		c.mu.Lock()
		c.ran++
		c.mu.Unlock()
		return msg(), nil
	}
}

func (c *counting) runs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ran
}

// TestHandleKeyError: a key the transport could not decode from its syntax
// (Call.KeyError) is refused as malformed, saying why, on a method that
// requires a key and on one without side effects, and the handler does
// not run.
func TestHandleKeyError(t *testing.T) {
	var (
		mu  sync.Mutex
		got []idem.Report
	)
	e := idemtest.NewEngine(t, memory.New(), idem.WithReportHook(func(_ context.Context, r idem.Report) {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
	}))
	c := &counting{}
	h := c.handler(func() transport.Reply { return transport.Reply{Message: &testv1.ReadResponse{Value: "v"}} })
	reason := errors.New("the quoted key has no closing double quote")
	for _, call := range []transport.Call{
		{Method: doMethod, KeyError: reason, Request: &testv1.DoRequest{Value: "v"}},
		{Method: readMethod, KeyError: reason, Request: &testv1.ReadRequest{Value: "v"}},
	} {
		_, err := transport.Handle(t.Context(), e, call, h)
		ie := wantRefusal(t, err, code.Code_INVALID_ARGUMENT)
		if v := keyViolation(t, ie); v.GetDescription() != reason.Error() {
			t.Errorf("%s: violation %v, want one on %s saying %q", call.Method, v, idem.KeyHeader, reason)
		}
	}
	if n := c.runs(); n != 0 {
		t.Errorf("the handler ran %d times for malformed keys", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0].Result != idem.ResultInvalidKey || got[1].Result != idem.ResultInvalidKey {
		t.Errorf("the hook saw %+v, want two invalid_key", got)
	}
}

// TestMalformedKeysSayWhy: a malformed key is refused with a message and a
// violation that say what is wrong, on a method that requires a key and on
// one idem stands aside from (Read, NO_SIDE_EFFECTS), which ignores a
// well-formed key: it runs every time and records nothing.
func TestMalformedKeysSayWhy(t *testing.T) {
	e := idemtest.NewEngine(t, memory.New())
	c := &counting{}
	for _, tc := range []struct {
		name string
		keys []string
		says string
	}{
		{"space", []string{"a b"}, "visible ASCII"},
		{"too long", []string{strings.Repeat("k", 256)}, "at most 255 bytes"},
		{"empty", []string{""}, "must not be empty"},
		{"newline", []string{"a\nb"}, "visible ASCII"},
		{"nul", []string{"a\x00b"}, "visible ASCII"},
		{"DEL", []string{"a\x7fb"}, "visible ASCII"},
		{"non-ASCII", []string{"ключ"}, "visible ASCII"},
		{"two values", []string{"k1", "k2"}, "exactly one value"},
		{"two values alike", []string{"k1", "k1"}, "exactly one value"},
	} {
		for _, call := range []transport.Call{
			{Method: doMethod, Keys: tc.keys, Request: &testv1.DoRequest{Value: "v"}},
			{Method: readMethod, Keys: tc.keys, Request: &testv1.ReadRequest{Value: "v"}},
		} {
			_, err := transport.Handle(t.Context(), e, call, c.handler(func() transport.Reply {
				return transport.Reply{Message: &testv1.ReadResponse{}}
			}))
			ie := wantRefusal(t, err, code.Code_INVALID_ARGUMENT)
			if !strings.Contains(ie.Status().GetMessage(), tc.says) || !strings.Contains(keyViolation(t, ie).GetDescription(), tc.says) {
				t.Errorf("%s, %s: %v does not say %q", tc.name, call.Method, ie, tc.says)
			}
		}
	}
	if n := c.runs(); n != 0 {
		t.Fatalf("the handler ran %d times for malformed keys, want 0", n)
	}
	for range 2 {
		call := transport.Call{Method: readMethod, Keys: []string{"k1"}, Request: &testv1.ReadRequest{Value: "v"}}
		a, err := transport.Handle(t.Context(), e, call, c.handler(func() transport.Reply {
			return transport.Reply{Message: &testv1.ReadResponse{Value: "v"}}
		}))
		if err != nil || a.Result == idem.ResultReplayed {
			t.Fatalf("a well-formed key on Read: %v, %v", a.Result, err)
		}
	}
	if n := c.runs(); n != 2 {
		t.Fatalf("Read ran %d times with a well-formed key, want 2", n)
	}
}

// TestKeyIsScopedByMethod: one key on two methods is two calls.
func TestKeyIsScopedByMethod(t *testing.T) {
	e := idemtest.NewEngine(t, memory.New())
	c := &counting{}
	for _, call := range []transport.Call{
		{Method: doMethod, Keys: []string{"k"}, Request: &testv1.DoRequest{Value: "v"}},
		{Method: maybeMethod, Keys: []string{"k"}, Request: &testv1.MaybeRequest{Value: "v"}},
	} {
		a, err := transport.Handle(t.Context(), e, call, c.handler(func() transport.Reply {
			return transport.Reply{Message: &testv1.MaybeResponse{Value: "v"}}
		}))
		if err != nil || a.Result != idem.ResultExecuted {
			t.Fatalf("%s with the key: %v, %v; want a run", call.Method, a.Result, err)
		}
	}
	if n := c.runs(); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
}

// TestOutgoingKeys: which outgoing calls get a key, which key, and the
// child keys inside a keyed handler, never the handler's own.
func TestOutgoingKeys(t *testing.T) {
	k := transport.NewOutgoingKeys()
	ctx := t.Context()

	_, keys, _, err := k.For(ctx, doMethod, nil, nil)
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
		{"the caller's own key", ctx, doMethod, []string{"mine"}, []string{"mine"}},
		{"no side effects", ctx, readMethod, nil, nil},
		{"optional key", ctx, maybeMethod, nil, nil},
		{"ContextWithKey", idem.ContextWithKey(ctx, "set"), doMethod, []string{"mine"}, []string{"set"}},
		{"ContextWithKey, optional key", idem.ContextWithKey(ctx, "set"), maybeMethod, nil, []string{"set"}},
	} {
		_, got, _, err := k.For(c.ctx, c.method, nil, c.sent)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	_, _, _, err = k.For(idem.ContextWithKey(ctx, "a b"), doMethod, nil, nil)
	wantRefusal(t, err, code.Code_INVALID_ARGUMENT)

	// Inside a keyed handler: a child key, and never the request's own key.
	e := idemtest.NewEngine(t, memory.New())
	var inside [][]string
	call := transport.Call{Method: doMethod, Keys: []string{"parent"}, Request: &testv1.DoRequest{Value: "v"}}
	_, err = transport.Handle(ctx, e, call, func(ctx context.Context) (transport.Reply, error) {
		for _, c := range []struct {
			method string
			sent   []string
		}{{doMethod, nil}, {doMethod, []string{"parent"}}, {readMethod, []string{"parent", "other"}}} {
			_, keys, _, err := k.For(ctx, c.method, nil, c.sent)
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
	parent := store.Scope{Method: doMethod, Key: "parent"}
	want := [][]string{
		{idemtest.CallKey(parent, doMethod, 1)},
		{idemtest.CallKey(parent, doMethod, 2)},
		{"other"},
	}
	if !slices.EqualFunc(inside, want, slices.Equal) {
		t.Errorf("keys inside the handler %q, want %q", inside, want)
	}
}
