package interceptor

import (
	"bytes"
	"context"
	"regexp"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
)

// validKey is the key rule written another way: 1 to 255 characters, each
// visible ASCII. A byte that is not UTF-8 matches no character class.
var validKey = regexp.MustCompile(`^[!-~]{1,255}$`)

// FuzzValidateKey checks ValidateKey against the rule and checks that a key
// read from metadata gets the same verdict. The seed corpus is in
// testdata/fuzz/FuzzValidateKey.
func FuzzValidateKey(f *testing.F) {
	f.Add("order-1")
	f.Add("")
	f.Fuzz(func(t *testing.T, key string) {
		err := ValidateKey(key)
		if want := validKey.MatchString(key); (err == nil) != want {
			t.Fatalf("ValidateKey(%q) = %v, want valid %v", key, err, want)
		}
		ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{KeyHeader: {key}})
		got, ok, mdErr := keyFromMetadata(ctx)
		if !ok || got != key || (mdErr == nil) != (err == nil) {
			t.Fatalf("keyFromMetadata with %q: %q, %v, %v; ValidateKey: %v", key, got, ok, mdErr, err)
		}
	})
}

// FuzzDecode feeds arbitrary recorded outcomes (a code and bytes, as a
// corrupt or foreign row would hold them) to decode, for a method whose
// response is decoded (CreatePayment) and one whose response is replayed as
// its raw bytes (TestService.Do, which has a map). decode must not panic,
// and what it accepts must be what the row says: an error status of the
// row's code, a response equal to the bytes' decoding, or for raw replay
// exactly the stored bytes. The seed corpus is in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	ms := newMethods(evaluateOptions(nil))
	decoded := ms.lookup(testv1.PaymentService_CreatePayment_FullMethodName)
	raw := ms.lookup(testv1.TestService_Do_FullMethodName)
	if decoded.output == nil || decoded.raw || raw.output == nil || !raw.raw {
		f.Fatalf("method policies: CreatePayment %+v, Do %+v; want one decoded and one raw", decoded, raw)
	}
	f.Add(uint32(codes.OK), []byte{})
	f.Add(uint32(codes.InvalidArgument), []byte{0x08, 0x03})
	f.Fuzz(func(t *testing.T, code uint32, body []byte) {
		out := store.Outcome{Code: codes.Code(code), Body: body}
		for _, m := range []*method{decoded, raw} {
			msg, err := decode(m, out)
			if err != nil {
				continue
			}
			if out.Code != codes.OK {
				st, ok := msg.(*spb.Status)
				if !ok || st.GetCode() != int32(code) || status.ErrorProto(st) == nil {
					t.Fatalf("decode(code %d, %x) = %v; want an error status of that code", code, body, msg)
				}
				continue
			}
			if msg.ProtoReflect().Descriptor() != m.output.Descriptor() {
				t.Fatalf("decode gave a %T, want %v", msg, m.output.Descriptor().FullName())
			}
			if m.raw {
				sent, err := proto.Marshal(msg)
				if err != nil || !bytes.Equal(sent, body) {
					t.Fatalf("raw replay sends %x (%v), stored %x", sent, err, body)
				}
				continue
			}
			want := m.output.New().Interface()
			if err := proto.Unmarshal(body, want); err != nil || !proto.Equal(msg, want) {
				t.Fatalf("decode(OK, %x) = %v; the bytes decode to %v (%v)", body, msg, want, err)
			}
		}
	})
}
