package oteltest

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
	"github.com/idemkit/idem/transport"
)

const (
	methodMaybe = "/idem.test.v1.TestService/Maybe"
	rpcMaybe    = "idem.test.v1.TestService/Maybe"
)

// TestClientKeysAreCountedBySource: the client interceptor counts the calls
// it sends with a key in idem.client.keys, by method and by where the key
// came from, and calls without a key not at all.
func TestClientKeysAreCountedBySource(t *testing.T) {
	tel := newTelemetry(t)
	client := interceptor.UnaryClientInterceptor(idem.WithMeterProvider(tel.mp))
	var sent []string
	invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		md, _ := metadata.FromOutgoingContext(ctx)
		sent = append(sent, md.Get(idem.KeyHeader)...)
		return nil
	}
	call := func(ctx context.Context, method string) {
		t.Helper()
		if err := client(ctx, method, &testv1.DoRequest{}, &testv1.DoResponse{}, nil, invoker); err != nil {
			t.Fatal(err)
		}
	}
	bg := context.Background()
	call(bg, methodDo)                                                                           // generated
	call(bg, methodDo)                                                                           // generated
	call(idem.ContextWithKey(bg, "key-"+secret), methodDo)                                       // caller
	call(metadata.AppendToOutgoingContext(bg, idem.KeyHeader, "key-"+secret+"-md"), methodMaybe) // caller
	call(bg, methodMaybe)                                                                        // no key
	call(bg, methodRead)                                                                         // no key
	// Inside a keyed handler: a derived key.
	e, err := idem.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	req := &testv1.DoRequest{Value: "v"}
	_, err = transport.Handle(bg, e, transport.Call{Method: methodDo, Keys: []string{"key-" + secret + "-parent"}, Request: req},
		func(ctx context.Context) (transport.Reply, error) {
			call(ctx, methodDo)
			return transport.Reply{Message: &testv1.DoResponse{}}, nil
		})
	if err != nil {
		t.Fatal(err)
	}

	if len(sent) != 5 {
		t.Errorf("the invoker saw %d keys, want 5: %q", len(sent), sent)
	}
	got := map[string]int64{}
	for k, p := range tel.collect(t)["idem.client.keys"] {
		got[k] = p.value
	}
	for k, n := range map[string]int64{
		attrs("rpc.method", rpcDo, "idem.key.source", "generated"): 2,
		attrs("rpc.method", rpcDo, "idem.key.source", "caller"):    1,
		attrs("rpc.method", rpcMaybe, "idem.key.source", "caller"): 1,
		attrs("rpc.method", rpcDo, "idem.key.source", "derived"):   1,
	} {
		if got[k] != n {
			t.Errorf("idem.client.keys{%s} = %d, want %d", k, got[k], n)
		}
		delete(got, k)
	}
	if len(got) != 0 {
		t.Errorf("idem.client.keys has other counts: %v", got)
	}
	wantNoSecrets(t, tel, secret)
}
