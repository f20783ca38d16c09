package transporttest

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// The methods of the test service the cases call.
const (
	doMethod    = testv1.TestService_Do_FullMethodName
	maybeMethod = testv1.TestService_Maybe_FullMethodName
	readMethod  = testv1.TestService_Read_FullMethodName
)

// tenant is the tenant of the cases' calls, unless they name another.
const tenant = "acme"

type testCase struct {
	name string
	run  func(t *testing.T, e *env)
}

// run is one run of the handler.
type run struct {
	method string
	// key is the call's key, as the handler's context carries it.
	key string
	// requestID is the request's key field (request_id) as the handler got
	// it.
	requestID string
}

// env is a case's server: the suite's handler, served by the harness on an
// engine of its own, and a client of it.
type env struct {
	client Client

	mu   sync.Mutex
	runs []run
	// answer, when set, answers the n-th run (from 1) in place of the
	// default response.
	answer func(ctx context.Context, method string, req proto.Message, n int) Reply
}

// newEnv serves a new env through h, on an engine on store/memory whose
// tenant is the request metadata x-tenant-id.
func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	e := &env{}
	engine := idemtest.NewEngine(t, memory.New(memory.WithLockTimeout(lockTimeout)), idem.WithTenant(idemtest.TenantFromHeader))
	e.client = h.Serve(t, engine, e.handle)
	return e
}

// handle is the env's Handler: it counts the run and answers.
func (e *env) handle(ctx context.Context, method string, req proto.Message) Reply {
	key, _ := idem.KeyFromContext(ctx)
	r := run{method: method, key: key}
	if m, ok := req.(interface{ GetRequestId() string }); ok {
		r.requestID = m.GetRequestId()
	}
	e.mu.Lock()
	e.runs = append(e.runs, r)
	n := len(e.runs)
	answer := e.answer
	e.mu.Unlock()
	if answer != nil {
		return answer(ctx, method, req, n)
	}
	return defaultReply(req, n)
}

// defaultReply answers req, the n-th run: its value, n, and labels enough
// that a map encoded in another order would show in the bytes.
func defaultReply(req proto.Message, n int) Reply {
	value := ""
	if m, ok := req.(interface{ GetValue() string }); ok {
		value = m.GetValue()
	}
	switch req.(type) {
	case *testv1.MaybeRequest:
		return Reply{Message: &testv1.MaybeResponse{Value: value, Execution: int64(n)}}
	case *testv1.ReadRequest:
		return Reply{Message: &testv1.ReadResponse{Value: value, Execution: int64(n)}}
	}
	return Reply{Message: &testv1.DoResponse{
		Value:     value,
		Execution: int64(n),
		Labels:    map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"},
	}}
}

func (e *env) setAnswer(f func(ctx context.Context, method string, req proto.Message, n int) Reply) {
	e.mu.Lock()
	e.answer = f
	e.mu.Unlock()
}

// runs returns the handler's runs so far.
func (e *env) ran() []run {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.runs)
}

// wantRuns fails the test unless the handler ran n times.
func (e *env) wantRuns(t *testing.T, n int) {
	t.Helper()
	if got := len(e.ran()); got != n {
		t.Fatalf("the handler ran %d times, want %d", got, n)
	}
}

// call makes r, as tenant unless r names another, failing the test when
// the call cannot be made.
func (e *env) call(t *testing.T, r Request) Response {
	t.Helper()
	resp, err := call(t.Context(), e.client, r)
	if err != nil {
		t.Fatalf("%s: %v", r.Method, err)
	}
	return resp
}

// call makes r with c, as tenant unless r names another.
func call(ctx context.Context, c Client, r Request) (Response, error) {
	if r.Header == nil {
		r.Header = map[string]string{}
	}
	if _, ok := r.Header["x-tenant-id"]; !ok {
		r.Header["x-tenant-id"] = tenant
	}
	return c.Call(ctx, r)
}

// do is a request of Do for value, with keys.
func do(value string, keys ...string) Request {
	return Request{Method: doMethod, Message: &testv1.DoRequest{Value: value}, Response: &testv1.DoResponse{}, Keys: keys}
}

// wantOK fails the test unless r is a response, replayed as replayed says.
func wantOK(t *testing.T, r Response, replayed bool) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("got %v, want a response", r.Err)
	}
	if r.Message == nil {
		t.Fatalf("a response without a message")
	}
	if r.Replayed != replayed {
		t.Fatalf("replayed %v, want %v", r.Replayed, replayed)
	}
}

// wantError fails the test unless r is an error of code c and idem's
// reason, not marked replayed (unless replayed), and returns it.
func wantError(t *testing.T, r Response, c code.Code, reason string, replayed bool) *Error {
	t.Helper()
	if r.Err == nil {
		t.Fatalf("got the response %v, want %v (%s)", r.Message, c, reason)
	}
	if r.Err.Code != c || r.Err.Reason != reason {
		t.Fatalf("got %v, want %v with reason %q", r.Err, c, reason)
	}
	if r.Replayed != replayed {
		t.Fatalf("%v: replayed %v, want %v", r.Err, r.Replayed, replayed)
	}
	if (reason == idem.ReasonKeyMissing || reason == idem.ReasonKeyInvalid) && len(r.Err.Details) > 0 && !keyViolation(r.Err) {
		t.Fatalf("%v: details %v, want a google.rpc.BadRequest violation on %s", r.Err, r.Err.Details, idem.KeyHeader)
	}
	return r.Err
}

// keyViolation reports whether e carries a google.rpc.BadRequest field
// violation on the key, as idem's refusals of a key do on the wires that
// carry details.
func keyViolation(e *Error) bool {
	for _, d := range e.Details {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if v.GetField() == idem.KeyHeader && v.GetDescription() != "" {
					return true
				}
			}
		}
	}
	return false
}

// wantExpires fails the test unless r says once when its key expires (an
// RFC 3339 time to come, in [idem.ExpiresHeader]), and returns it.
func wantExpires(t *testing.T, r Response) time.Time {
	t.Helper()
	v := r.Header[idem.ExpiresHeader]
	if len(v) != 1 {
		t.Fatalf("%s %q, want one value (header %v)", idem.ExpiresHeader, v, r.Header)
	}
	at, err := time.Parse(time.RFC3339, v[0])
	if err != nil || !at.After(time.Now()) {
		t.Fatalf("%s %q (%v), want an RFC 3339 time to come", idem.ExpiresHeader, v[0], err)
	}
	return at
}

var cases = []testCase{
	{"KeyMissing", keyMissing},
	{"KeyMalformed", keyMalformed},
	{"MethodWithoutSideEffects", methodWithoutSideEffects},
	{"RunsOnceAndReplays", runsOnceAndReplays},
	{"KeyReused", keyReused},
	{"KeyInUse", keyInUse},
	{"TransientErrorReleasesTheKey", transientErrorReleasesTheKey},
	{"RecordedErrorReplays", recordedErrorReplays},
	{"MetadataReplays", metadataReplays},
	{"KeyField", keyField},
	{"KeyFieldAndMetadataDiffer", keyFieldAndMetadataDiffer},
	{"TenantScopesKeys", tenantScopesKeys},
}

// keyMissing: a method that requires a key refuses a call without one,
// INVALID_ARGUMENT, KEY_MISSING, and its handler does not run; a method
// that takes a key and needs none runs without one, every time.
func keyMissing(t *testing.T, e *env) {
	wantError(t, e.call(t, do("v")), code.Code_INVALID_ARGUMENT, idem.ReasonKeyMissing, false)
	e.wantRuns(t, 0)
	for range 2 {
		r := e.call(t, Request{Method: maybeMethod, Message: &testv1.MaybeRequest{Value: "v"}, Response: &testv1.MaybeResponse{}})
		wantOK(t, r, false)
	}
	e.wantRuns(t, 2)
}

// malformed are keys the engine refuses, each as the values of the key
// sent, which every wire can carry.
var malformed = []struct {
	name string
	keys []string
}{
	{"empty", []string{""}},
	{"256 bytes", []string{strings.Repeat("k", 256)}},
	{"space", []string{"a b"}},
	{"two values", []string{"k1", "k2"}},
}

// keyMalformed: a malformed key is refused, INVALID_ARGUMENT,
// KEY_INVALID, on a method that requires a key and on one that takes one,
// and the handler does not run; 255 bytes is the longest key taken.
func keyMalformed(t *testing.T, e *env) {
	for _, m := range malformed {
		t.Run(m.name, func(t *testing.T) {
			wantError(t, e.call(t, do("v", m.keys...)), code.Code_INVALID_ARGUMENT, idem.ReasonKeyInvalid, false)
			r := Request{Method: maybeMethod, Message: &testv1.MaybeRequest{Value: "v"}, Response: &testv1.MaybeResponse{}, Keys: m.keys}
			wantError(t, e.call(t, r), code.Code_INVALID_ARGUMENT, idem.ReasonKeyInvalid, false)
		})
	}
	e.wantRuns(t, 0)
	wantOK(t, e.call(t, do("v", strings.Repeat("k", 255))), false)
	e.wantRuns(t, 1)
}

// methodWithoutSideEffects: a method without side effects (Read,
// NO_SIDE_EFFECTS) is never keyed: it runs every time, with a well-formed
// key too, which it ignores; a malformed key is still the client's bug,
// refused as on any method.
func methodWithoutSideEffects(t *testing.T, e *env) {
	read := func(keys ...string) Response {
		return e.call(t, Request{Method: readMethod, Message: &testv1.ReadRequest{Value: "v"}, Response: &testv1.ReadResponse{}, Keys: keys})
	}
	for _, keys := range [][]string{nil, {"k1"}, {"k1"}} {
		wantOK(t, read(keys...), false)
	}
	e.wantRuns(t, 3)
	for _, m := range malformed {
		wantError(t, read(m.keys...), code.Code_INVALID_ARGUMENT, idem.ReasonKeyInvalid, false)
	}
	e.wantRuns(t, 3)
}

// runsOnceAndReplays: the first call runs the handler and answers, not
// marked replayed; its retries get the same bytes, marked replayed, with a
// field excluded from the fingerprint changed too, and the handler runs no
// more.
func runsOnceAndReplays(t *testing.T, e *env) {
	first := e.call(t, do("v", "k"))
	wantOK(t, first, false)
	expires := wantExpires(t, first)
	if got := first.Message.(*testv1.DoResponse); got.GetValue() != "v" || got.GetExecution() != 1 || len(got.GetLabels()) != 6 {
		t.Fatalf("first response %v, want value v, execution 1 and six labels", got)
	}
	retry := do("v", "k")
	retry.Message.(*testv1.DoRequest).TraceId = "another trace"
	for _, r := range []Request{do("v", "k"), retry} {
		again := e.call(t, r)
		wantOK(t, again, true)
		if !bytes.Equal(again.Body, first.Body) || len(first.Body) == 0 {
			t.Fatalf("replay differs from the first response:\n%q\n%q", again.Body, first.Body)
		}
		if !proto.Equal(again.Message, first.Message) {
			t.Fatalf("replay %v, first response %v", again.Message, first.Message)
		}
		if at := wantExpires(t, again); !at.Equal(expires) {
			t.Fatalf("the replay says the key expires at %v, the first answer %v", at, expires)
		}
	}
	e.wantRuns(t, 1)
}

// keyReused: the key of a call, with another request: FAILED_PRECONDITION,
// KEY_REUSED, never a replay, and the handler does not run.
func keyReused(t *testing.T, e *env) {
	wantOK(t, e.call(t, do("v", "k")), false)
	wantError(t, e.call(t, do("other", "k")), code.Code_FAILED_PRECONDITION, idem.ReasonKeyReused, false)
	e.wantRuns(t, 1)
}

// keyInUse: a duplicate of a call still running waits for it, up to the
// lock timeout, and is then answered ABORTED, KEY_IN_USE, with a retry
// hint; the handler runs once, and its answer is replayed once it is
// recorded.
func keyInUse(t *testing.T, e *env) {
	started, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	// Free the first call before the server stops, when the case fails.
	t.Cleanup(free)
	e.setAnswer(func(ctx context.Context, _ string, req proto.Message, n int) Reply {
		if n == 1 {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return defaultReply(req, n)
	})
	firstDone := make(chan Response, 1)
	go func() {
		r, err := call(context.Background(), e.client, do("v", "k"))
		if err != nil {
			r.Err = &Error{Message: err.Error()}
		}
		firstDone <- r
	}()
	<-started
	dup := wantError(t, e.call(t, do("v", "k")), code.Code_ABORTED, idem.ReasonKeyInUse, false)
	if dup.RetryAfter <= 0 {
		t.Fatalf("%v without a retry hint", dup)
	}
	free()
	wantOK(t, <-firstDone, false)
	wantOK(t, e.call(t, do("v", "k")), true)
	e.wantRuns(t, 1)
}

// transientErrorReleasesTheKey: a transient error of the handler
// (UNAVAILABLE) is sent as it is, not recorded: the retry runs the handler
// again, and its answer is the one replayed.
func transientErrorReleasesTheKey(t *testing.T, e *env) {
	e.setAnswer(func(_ context.Context, _ string, req proto.Message, n int) Reply {
		if n == 1 {
			return Reply{Status: &spb.Status{Code: int32(code.Code_UNAVAILABLE), Message: "blip"}}
		}
		return defaultReply(req, n)
	})
	if err := wantError(t, e.call(t, do("v", "k")), code.Code_UNAVAILABLE, "", false); err.Message != "blip" {
		t.Fatalf("message %q, want the handler's", err.Message)
	}
	retry := e.call(t, do("v", "k"))
	wantOK(t, retry, false)
	if n := retry.Message.(*testv1.DoResponse).GetExecution(); n != 2 {
		t.Fatalf("the retry answered execution %d, want 2", n)
	}
	again := e.call(t, do("v", "k"))
	wantOK(t, again, true)
	if !proto.Equal(again.Message, retry.Message) {
		t.Fatalf("replay %v, want the retry's %v", again.Message, retry.Message)
	}
	e.wantRuns(t, 2)
}

// handlerError is a deterministic error of the handler, with details.
func handlerError(t *testing.T) *spb.Status {
	t.Helper()
	var details []*anypb.Any
	for _, d := range []proto.Message{
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "value", Description: "must be positive"}}},
		&errdetails.ErrorInfo{Reason: "VALUE_NEGATIVE", Domain: "test.example.com", Metadata: map[string]string{"value": "-1"}},
	} {
		a, err := anypb.New(d)
		if err != nil {
			t.Fatal(err)
		}
		details = append(details, a)
	}
	return &spb.Status{Code: int32(code.Code_INVALID_ARGUMENT), Message: "value must be positive", Details: details}
}

// recordedErrorReplays: a deterministic error of the handler is recorded
// and replayed, marked replayed, with its code, message and details; the
// handler runs once.
func recordedErrorReplays(t *testing.T, e *env) {
	st := handlerError(t)
	e.setAnswer(func(context.Context, string, proto.Message, int) Reply { return Reply{Status: st} })
	first := wantError(t, e.call(t, do("v", "k")), code.Code_INVALID_ARGUMENT, "", false)
	again := wantError(t, e.call(t, do("v", "k")), code.Code_INVALID_ARGUMENT, "", true)
	want := ErrorFromStatus(st)
	for _, got := range []*Error{first, again} {
		if got.Message != want.Message || len(got.Details) != len(want.Details) {
			t.Fatalf("got %v with details %v, want %v with %v", got, got.Details, want, want.Details)
		}
		for i := range got.Details {
			if !proto.Equal(got.Details[i], want.Details[i]) {
				t.Fatalf("detail %d: %v, want %v", i, got.Details[i], want.Details[i])
			}
		}
	}
	e.wantRuns(t, 1)
}

// metadataReplays: the headers and trailers the handler set are sent with
// the first answer and replayed with it, a response or an error.
func metadataReplays(t *testing.T, e *env) {
	header := map[string][]string{"x-charge-id": {"ch_1"}, "x-multi": {"a", "b"}}
	trailer := map[string][]string{"x-ledger": {"l-9"}}
	e.setAnswer(func(_ context.Context, _ string, req proto.Message, n int) Reply {
		r := defaultReply(req, n)
		if req.(*testv1.DoRequest).GetValue() == "bad" {
			r = Reply{Status: &spb.Status{Code: int32(code.Code_FAILED_PRECONDITION), Message: "bad value"}}
		}
		r.Header, r.Trailer = header, trailer
		return r
	})
	for _, value := range []string{"ok", "bad"} {
		t.Run(value, func(t *testing.T) {
			for i, replayed := range []bool{false, true} {
				r := e.call(t, do(value, "k-"+value))
				if value == "ok" {
					wantOK(t, r, replayed)
				} else {
					wantError(t, r, code.Code_FAILED_PRECONDITION, "", replayed)
				}
				wantExpires(t, r)
				for _, want := range []struct {
					part string
					want map[string][]string
					got  map[string][]string
				}{{"header", header, r.Header}, {"trailer", trailer, r.Trailer}} {
					for name, values := range want.want {
						got := want.got[name]
						if r.Err != nil && got == nil {
							// On an error some wires send the trailers
							// with the headers.
							got = r.Header[name]
						}
						if !slices.Equal(got, values) {
							t.Fatalf("answer %d: %s %s %q, want %q (header %v, trailer %v)", i+1, want.part, name, got, values, r.Header, r.Trailer)
						}
					}
				}
			}
		})
	}
	e.wantRuns(t, 2)
}

// keyField: a key sent in the request's key field (request_id) alone is
// the call's key, as the metadata's is, and as both are when they agree; a key sent in the metadata alone
// reaches the handler in that field, so that the handler sees its key
// where it looks for it, and a retry with the key in the field replays.
func keyField(t *testing.T, e *env) {
	inField := func(key string) Request {
		r := do("v")
		r.Message.(*testv1.DoRequest).RequestId = key
		return r
	}
	wantOK(t, e.call(t, inField("k-field")), false)
	wantOK(t, e.call(t, inField("k-field")), true)
	wantOK(t, e.call(t, do("v", "k-field")), true)
	both := inField("k-field")
	both.Keys = []string{"k-field"}
	wantOK(t, e.call(t, both), true)

	first := e.call(t, do("v", "k-header"))
	wantOK(t, first, false)
	again := e.call(t, inField("k-header"))
	wantOK(t, again, true)
	if !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("the retry with the key in the field got %q, want the first answer %q", again.Body, first.Body)
	}
	runs := e.ran()
	if len(runs) != 2 || runs[0].requestID != "k-field" || runs[1].requestID != "k-header" ||
		runs[0].key != "k-field" || runs[1].key != "k-header" {
		t.Fatalf("runs %+v, want one with k-field, one with k-header, each in request_id and the context", runs)
	}
	wantError(t, e.call(t, inField("has space")), code.Code_INVALID_ARGUMENT, idem.ReasonKeyInvalid, false)
	e.wantRuns(t, 2)
}

// keyFieldAndMetadataDiffer: a request whose key field and metadata carry
// two keys is refused, INVALID_ARGUMENT, KEY_INVALID, naming the field: the
// handler does not run.
func keyFieldAndMetadataDiffer(t *testing.T, e *env) {
	r := do("v", "k-header")
	r.Message.(*testv1.DoRequest).RequestId = "k-field"
	err := wantError(t, e.call(t, r), code.Code_INVALID_ARGUMENT, idem.ReasonKeyInvalid, false)
	if !strings.Contains(err.Message, "request_id") {
		t.Fatalf("message %q does not name the field", err.Message)
	}
	e.wantRuns(t, 0)
}

// tenantScopesKeys: a key is scoped by the tenant the request metadata
// names: one key in two tenants is two calls, each replayed in its own.
func tenantScopesKeys(t *testing.T, e *env) {
	as := func(tenant string) Request {
		r := do("v", "k")
		r.Header = map[string]string{"x-tenant-id": tenant}
		return r
	}
	wantOK(t, e.call(t, as("acme")), false)
	wantOK(t, e.call(t, as("globex")), false)
	wantOK(t, e.call(t, as("acme")), true)
	wantOK(t, e.call(t, as("globex")), true)
	e.wantRuns(t, 2)
}

type outgoingCase struct {
	name string
	run  func(t *testing.T, h OutgoingHarness)
}

var outgoingCases = []outgoingCase{
	{"ChildKeys", childKeys},
}

// childKeys: the calls a keyed handler makes through the adapter's client
// carry the keys idem derives from the handler's call, the same on the
// handler's every run, so that the retry of a handler that failed after
// them is answered from the downstream's record; the handler's own key,
// even when it forwards it, never goes downstream.
func childKeys(t *testing.T, h OutgoingHarness) {
	downstream := newEnv(t, h)
	out := h.Outgoing(t, downstream.client)
	front := newEnv(t, h)
	var (
		mu       sync.Mutex
		replayed []bool
	)
	front.setAnswer(func(ctx context.Context, _ string, req proto.Message, n int) Reply {
		parent, _ := idem.KeyFromContext(ctx)
		for i, keys := range [][]string{nil, {parent}} {
			r, err := out.Call(ctx, do("child"+string(rune('1'+i)), keys...))
			if err != nil {
				return Reply{Status: &spb.Status{Code: int32(code.Code_INTERNAL), Message: err.Error()}}
			}
			if r.Err != nil {
				return Reply{Status: &spb.Status{Code: int32(code.Code_INTERNAL), Message: "downstream: " + r.Err.Error()}}
			}
			mu.Lock()
			replayed = append(replayed, r.Replayed)
			mu.Unlock()
		}
		if n == 1 {
			return Reply{Status: &spb.Status{Code: int32(code.Code_UNAVAILABLE), Message: "lost the reply"}}
		}
		return defaultReply(req, n)
	})
	wantError(t, front.call(t, do("v", "parent")), code.Code_UNAVAILABLE, "", false)
	wantOK(t, front.call(t, do("v", "parent")), false)
	front.wantRuns(t, 2)

	scope := store.Scope{Tenant: tenant, Method: doMethod, Key: "parent"}
	want := []string{idemtest.CallKey(scope, doMethod, 1), idemtest.CallKey(scope, doMethod, 2)}
	runs := downstream.ran()
	var got []string
	for _, r := range runs {
		got = append(got, r.key)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the downstream ran with keys %q, want %q", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(replayed, []bool{false, false, true, true}) {
		t.Fatalf("downstream answers replayed %v, want the first run's not, the retry's yes", replayed)
	}
}
