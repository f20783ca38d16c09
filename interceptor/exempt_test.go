package interceptor_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// TestExemptMethodRefusesMalformedKeys: a method idem stands aside from
// (Read, NO_SIDE_EFFECTS) runs untouched with a well-formed key, which is
// ignored, but a malformed key is the client's bug and is refused with
// INVALID_ARGUMENT, as on any other method: the handler does not run and
// nothing is stored.
func TestExemptMethodRefusesMalformedKeys(t *testing.T) {
	e := newEnv(t, setup{})
	read := &testv1.ReadRequest{Value: "v"}
	for _, c := range []struct {
		name string
		keys []string
		says string
	}{
		{"space", []string{"a b"}, "visible ASCII"},
		{"too long", []string{strings.Repeat("k", 256)}, "at most 255 bytes"},
		{"empty", []string{""}, "must not be empty"},
		{"two values", []string{"k1", "k2"}, "exactly one value"},
		{"two values alike", []string{"k1", "k1"}, "exactly one value"},
	} {
		t.Run(c.name, func(t *testing.T) {
			md := metadata.MD{}
			md.Set(idem.KeyHeader, c.keys...)
			_, err := e.client.Read(metadata.NewOutgoingContext(context.Background(), md), read)
			wantBadKey(t, err)
			if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), c.says) {
				t.Errorf("message %q does not say %q", st.Message(), c.says)
			}
		})
	}
	if n := e.svc.count(); n != 0 {
		t.Fatalf("the handler ran %d times for malformed keys, want 0", n)
	}

	// A well-formed key is ignored: the call runs, every time, and leaves
	// no key.
	for range 2 {
		resp, err := e.client.Read(withKey("k1"), read)
		if err != nil || resp.GetValue() != "v" {
			t.Fatalf("a well-formed key: %v, %v", resp, err)
		}
	}
	if n, k := e.svc.count(), e.keys(t); n != 2 || k != 0 {
		t.Fatalf("%d executions and %d keys, want 2 and 0", n, k)
	}
}
