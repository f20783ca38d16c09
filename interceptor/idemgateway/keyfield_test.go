package idemgateway_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	gatewaytestv1 "github.com/idemkit/idem/interceptor/idemgateway/internal/gen/idem/gatewaytest/v1"
)

// withRequestID returns transfer with its key field set to id.
func withRequestID(id string) string {
	return strings.Replace(transfer, `{`, `{"requestId":`+`"`+id+`",`, 1)
}

// TestKeyField: a key in the request's key field (request_id) works as the
// header's, and a malformed one is refused as malformed, naming the field,
// although no Idempotency-Key header came: the server decides what is
// wrong, not the gateway.
func TestKeyField(t *testing.T) {
	e := newEnv(t, config{})

	r := e.create(t, withRequestID("has space"))
	p := problem(t, r, http.StatusBadRequest, idem.ReasonKeyInvalid)
	if !strings.Contains(p.Detail, "request_id") || !strings.Contains(p.Detail, "requestId") || !strings.Contains(p.Detail, "visible ASCII") {
		t.Fatalf("detail %q; want it to name the field and say what is wrong", p.Detail)
	}
	if strings.Contains(p.Detail, "Idempotency-Key header") {
		t.Fatalf("detail %q blames a header that did not come", p.Detail)
	}

	// The header and the field disagree.
	r = e.create(t, withRequestID("order-f2"), "Idempotency-Key", "order-f3")
	if p := problem(t, r, http.StatusBadRequest, idem.ReasonKeyInvalid); !strings.Contains(p.Detail, "request_id") {
		t.Fatalf("detail %q; want it to name the field", p.Detail)
	}
	if n := e.svc.calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for malformed keys, want 0", n)
	}
	if n := e.count(t, `SELECT count(*) FROM idempotency_keys`) + e.count(t, `SELECT count(*) FROM transfers`); n != 0 {
		t.Fatalf("%d rows, want none", n)
	}

	// A well-formed key in the field runs, and replays.
	first := e.create(t, withRequestID("order-f1"))
	again := e.create(t, withRequestID("order-f1"))
	if first.status != http.StatusOK || again.status != http.StatusOK || again.header.Get(idem.HTTPReplayedHeader) != "true" ||
		string(again.body) != string(first.body) {
		t.Fatalf("key in the field: %d %s, then %d %q %s", first.status, first.body, again.status,
			again.header.Get(idem.HTTPReplayedHeader), again.body)
	}
	if state, _, ok := e.keyRow(t, "acme", "order-f1"); !ok || state != "recorded" {
		t.Fatalf("key row of the field's key: %q %v", state, ok)
	}
	if n := e.svc.calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}

	// gRPC answers the same: INVALID_ARGUMENT, reason
	// IDEMPOTENCY_KEY_INVALID, the violation naming the field.
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant-id", "acme")
	_, err := e.grpc.CreateTransfer(ctx, &gatewaytestv1.CreateTransferRequest{
		FromAccount: "alice", ToAccount: "bob", AmountCents: 1, RequestId: "has space"})
	wantKeyError(t, err, idem.ReasonKeyInvalid, "request_id")
	_, err = e.grpc.CreateTransfer(ctx, &gatewaytestv1.CreateTransferRequest{FromAccount: "alice", ToAccount: "bob", AmountCents: 1})
	wantKeyError(t, err, idem.ReasonKeyMissing, "required")
	if n := e.svc.calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// TestExemptMethodKeys: GetTransfer (NO_SIDE_EFFECTS) runs untouched with a
// well-formed key, in the header or its key field, and refuses a malformed
// one, in either place, over HTTP and gRPC alike.
func TestExemptMethodKeys(t *testing.T) {
	e := newEnv(t, config{})
	get := func(query string, headers ...string) reply {
		return e.do(t, http.MethodGet, "/v1/transfers/404"+query, "", headers...)
	}
	for _, c := range []struct {
		name, query string
		headers     []string
		says        string
	}{
		{"field", "?requestId=" + url.QueryEscape("has space"), nil, "request_id"},
		{"field and header differ", "?requestId=k1", []string{"Idempotency-Key", "k2"}, "request_id"},
		{"header", "", []string{"Idempotency-Key", "k1,k2"}, "more than one key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := problem(t, get(c.query, c.headers...), http.StatusBadRequest, idem.ReasonKeyInvalid)
			if !strings.Contains(p.Detail, c.says) {
				t.Fatalf("detail %q does not say %q", p.Detail, c.says)
			}
		})
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant-id", "acme")
	_, err := e.grpc.GetTransfer(ctx, &gatewaytestv1.GetTransferRequest{Id: "404", RequestId: "has space"})
	wantKeyError(t, err, idem.ReasonKeyInvalid, "request_id")
	if n := e.svc.reads.Load(); n != 0 {
		t.Fatalf("GetTransfer ran %d times for malformed keys, want 0", n)
	}

	// Well-formed keys are ignored: the call runs (and finds nothing).
	for _, r := range []reply{get("?requestId=k1"), get("", "Idempotency-Key", `"k1"`), get("?requestId=k1", "Idempotency-Key", "k1")} {
		if r.status != http.StatusNotFound || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("a well-formed key: %d %s %s; want GetTransfer's 404", r.status, r.header.Get("Content-Type"), r.body)
		}
	}
	_, err = e.grpc.GetTransfer(metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, "k1"),
		&gatewaytestv1.GetTransferRequest{Id: "404", RequestId: "k1"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("gRPC, a well-formed key: %v; want GetTransfer's NOT_FOUND", err)
	}
	if n := e.svc.reads.Load(); n != 4 {
		t.Fatalf("GetTransfer ran %d times for well-formed keys, want 4", n)
	}
	if n := e.count(t, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Fatalf("%d key rows, want none", n)
	}
}

// wantKeyError fails t unless err is INVALID_ARGUMENT with ErrorInfo reason
// and a BadRequest violation on idempotency-key that says says.
func wantKeyError(t *testing.T, err error, reason, says string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("%v; want INVALID_ARGUMENT", err)
	}
	var info *errdetails.ErrorInfo
	var violation *errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			if len(d.GetFieldViolations()) == 1 {
				violation = d.GetFieldViolations()[0]
			}
		}
	}
	if info.GetReason() != reason || info.GetDomain() != idem.Domain {
		t.Fatalf("ErrorInfo %v; want reason %s in domain %s", info, reason, idem.Domain)
	}
	if violation.GetField() != idem.KeyHeader || !strings.Contains(violation.GetDescription(), says) {
		t.Fatalf("violation %v; want one on %s saying %q", violation, idem.KeyHeader, says)
	}
}
