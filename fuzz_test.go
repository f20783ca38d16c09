package idem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"regexp"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/reflect/protoreflect"

	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/record"
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
		err := validateKey(key)
		if want := validKey.MatchString(key); (err == nil) != want {
			t.Fatalf("validateKey(%q) = %v, want valid %v", key, err, want)
		}
		got, ok, callErr := keyFrom([]string{key})
		if !ok || got != key || (callErr == nil) != (err == nil) {
			t.Fatalf("keyFrom(%q): %q, %v, %v; ValidateKey: %v", key, got, ok, callErr, err)
		}
	})
}

// FuzzDecode feeds arbitrary recorded outcomes (a code and bytes, as a
// corrupt or foreign row would hold them) to decode, for a method whose
// response is decoded (CreatePayment) and one whose response is replayed as
// its raw bytes (TestService.Do, which has a map). Each input is decoded as
// it is and sealed in a sound envelope of its code. decode must not panic,
// and what it accepts must be what the row says: a gRPC code (0 to 16);
// for an envelope, a sound one of the row's code; an error status of the
// row's code; a response equal to the payload's decoding, without unknown
// fields when no envelope vouches for it; or for raw replay exactly the
// payload. The seed corpus is in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	ms := newMethods(nil)
	decoded := ms.lookup(testv1.PaymentService_CreatePayment_FullMethodName)
	raw := ms.lookup(testv1.TestService_Do_FullMethodName)
	if decoded.output == nil || decoded.raw || raw.output == nil || !raw.raw {
		f.Fatalf("method policies: CreatePayment %+v, Do %+v; want one decoded and one raw", decoded, raw)
	}
	f.Add(uint32(code.Code_OK), []byte{})
	f.Add(uint32(code.Code_INVALID_ARGUMENT), []byte{0x08, 0x03})
	if body, _, err := encodeOutcome(code.Code_INVALID_ARGUMENT, &spb.Status{Code: int32(code.Code_INVALID_ARGUMENT), Message: "no"}, nil, nil, nil); err == nil {
		f.Add(uint32(code.Code_INVALID_ARGUMENT), body)
	}
	f.Fuzz(func(t *testing.T, c uint32, body []byte) {
		inputs := []store.Outcome{{Code: code.Code(c), Body: body}}
		if c <= 0xff {
			inputs = append(inputs, store.Outcome{Code: code.Code(c), Body: seal(byte(c), body)})
		}
		for _, out := range inputs {
			// What the record's own reader (tested on its own, against
			// the formats' golden bytes) makes of the body: decode must
			// replay its payload, and only when it vouches for the row.
			payload, enveloped, sound := out.Body, false, true
			if rec, err := record.Decode(out.Body); err != nil {
				sound = false
			} else if !rec.Bare {
				enveloped = true
				payload = rec.Payload
				sound = uint32(rec.Code) == c
			}
			for _, m := range []*method{decoded, raw} {
				rec, err := decode(m, out)
				if err != nil {
					continue
				}
				msg, sent := rec.msg, rec.payload
				if !bytes.Equal(sent, payload) {
					t.Fatalf("decode(code %d, %x) replays %x, recorded %x", c, out.Body, sent, payload)
				}
				if c > 16 || !sound {
					t.Fatalf("decode(code %d, %x) accepted a row it cannot vouch for: %v", c, out.Body, msg)
				}
				if out.Code != code.Code_OK {
					st, ok := msg.(*spb.Status)
					if !ok || st.GetCode() != int32(c) {
						t.Fatalf("decode(code %d, %x) = %v; want an error status of that code", c, out.Body, msg)
					}
					continue
				}
				if msg.ProtoReflect().Descriptor() != m.output.Descriptor() {
					t.Fatalf("decode gave a %T, want %v", msg, m.output.Descriptor().FullName())
				}
				if m.raw {
					wire, err := proto.Marshal(rawMessage(m, sent))
					if err != nil || !bytes.Equal(wire, payload) {
						t.Fatalf("raw replay sends %x (%v), recorded %x", wire, err, payload)
					}
					continue
				}
				want := m.output.New().Interface()
				if err := proto.Unmarshal(payload, want); err != nil || !proto.Equal(msg, want) {
					t.Fatalf("decode(OK, %x) = %v; the payload decodes to %v (%v)", out.Body, msg, want, err)
				}
				if !enveloped && unknownFields(msg) {
					t.Fatalf("decode(OK, %x) = %v, with unknown fields and no envelope to vouch for them", out.Body, msg)
				}
			}
		}
	})
}

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// seal wraps payload in a sound envelope of code, written out here as the
// format says rather than by encodeOutcome.
func seal(code byte, payload []byte) []byte {
	b := []byte{0, code}
	b = binary.BigEndian.AppendUint32(b, crc32.Update(crc32.Checksum([]byte{code}, crc32c), crc32c, payload))
	return append(b, payload...)
}

// unknownFields reports whether m or any message within it has unknown
// fields.
func unknownFields(m proto.Message) bool {
	found := errors.New("unknown fields")
	err := protorange.Range(m.ProtoReflect(), func(v protopath.Values) error {
		if msg, ok := v.Index(-1).Value.Interface().(protoreflect.Message); ok && len(msg.GetUnknown()) > 0 {
			return found
		}
		return nil
	})
	return err == found
}
