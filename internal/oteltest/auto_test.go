package oteltest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/transport"
)

// TestAutoModeSaysWhichClaim: in auto mode the call's span carries
// idem.optimistic, whether its claim read nothing first (a first attempt)
// or not (a retry, an unmarked call), and idem.mode auto; the counter of
// calls counts them under idem.mode auto, with no attribute of the claim.
func TestAutoModeSaysWhichClaim(t *testing.T) {
	h := newHarness(t)
	e := h.engine(t, nil, idem.WithMethodPolicy(methodDo, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeAuto}))
	before := h.tel.collect(t)
	for i, c := range []struct {
		header map[string][]string
		want   bool
	}{
		{map[string][]string{idem.AttemptHeader: {"1"}}, true},
		{map[string][]string{idem.AttemptHeader: {"2"}}, false},
		{nil, false},
	} {
		req := &testv1.DoRequest{Value: "v"}
		ctx, span := h.tel.tp.Tracer("test").Start(context.Background(), "server")
		_, err := transport.Handle(ctx, e, transport.Call{Method: methodDo, Keys: []string{"k-SECRET-" + string(rune('a'+i))}, Request: req, Header: c.header, Status: grpcStatus}, echo(req))
		span.End()
		if err != nil {
			t.Fatal(err)
		}
		ended := h.tel.spans.Ended()
		sa := map[attribute.Key]attribute.Value{}
		for _, kv := range ended[len(ended)-1].Attributes() {
			sa[kv.Key] = kv.Value
		}
		if v, ok := sa["idem.optimistic"]; !ok || v.Type() != attribute.BOOL || v.AsBool() != c.want || sa["idem.mode"].AsString() != "auto" {
			t.Errorf("header %v: span attributes %v, want idem.optimistic %v and idem.mode auto", c.header, ended[len(ended)-1].Attributes(), c.want)
		}
	}
	changed := diff(before, h.tel.collect(t))
	want := attrs("rpc.method", rpcDo, "idem.mode", "auto", "idem.result", "executed")
	if p := changed["idem.server.requests"][want]; p.value != 3 || len(changed["idem.server.requests"]) != 1 {
		t.Errorf("idem.server.requests moved %v, want 3 under %s", describe(changed["idem.server.requests"]), want)
	}
	wantNoSecrets(t, h.tel, tenant, secret)
}
