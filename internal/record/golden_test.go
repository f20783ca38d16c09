package record

import (
	"bytes"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// A legacy vector is a body that interceptor/outcome.go (encodeOutcome)
// wrote before this package existed, as hex, with the inputs it was given
// and what its reader (openEnvelope) made of it.
type legacyVector struct {
	name            string
	code            code.Code
	msg             proto.Message
	header, trailer map[string][]string
	body            string
	// wantHeader and wantTrailer are what openEnvelope returned.
	wantHeader, wantTrailer map[string][]string
}

func paymentResponse() *testv1.CreatePaymentResponse {
	return &testv1.CreatePaymentResponse{Payment: &testv1.Payment{Id: "p1", AmountCents: 1250}}
}

func badRequest(t testing.TB) *spb.Status {
	d, err := anypb.New(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount_cents", Description: "must be positive"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &spb.Status{Code: int32(code.Code_INVALID_ARGUMENT), Message: "invalid payment", Details: []*anypb.Any{d}}
}

func legacyVectors(t testing.TB) []legacyVector {
	header := map[string][]string{
		"x-request-cost":          {"3"},
		"x-tags":                  {"a", "b"},
		"x-trace-bin":             {"\x00\xff\xfe\x80"},
		"X-Upper":                 {"kept"},
		"grpc-status":             {"0"},
		"content-type":            {"application/grpc"},
		"idempotency-key":         {"k"},
		"idempotent-replayed":     {"true"},
		"idempotency-key-expires": {"x"},
		":status":                 {"200"},
		"x-empty":                 {},
		"x-blank":                 {""},
	}
	trailer := map[string][]string{"x-checksum-bin": {"\x01\x02"}, "x-done": {"yes"}, "grpc-message": {"no"}}
	return []legacyVector{{
		name: "response",
		code: code.Code_OK,
		msg:  paymentResponse(),
		body: "000025451f2f0a070a02703118e209",
	}, {
		name: "empty response",
		code: code.Code_OK,
		msg:  &testv1.CreatePaymentResponse{},
		body: "0000527d5351",
	}, {
		name: "error",
		code: code.Code_INVALID_ARGUMENT,
		msg:  badRequest(t),
		body: "0003713f184b0803120f696e76616c6964207061796d656e741a4f0a29747970652e676f6f676c65617069732e636f6d2f676f6f676c652e7270632e4261645265717565737412220a200a0c616d6f756e745f63656e747312106d75737420626520706f736974697665",
	}, {
		name:    "response with metadata",
		code:    code.Code_OK,
		msg:     paymentResponse(),
		header:  header,
		trailer: trailer,
		body:    "0100e56f1f9587010a0f0a07582d557070657212046b6570740a0b0a07782d626c616e6b12000a130a0e782d726571756573742d636f73741201330a0b0a06782d746167731201610a0b0a06782d746167731201620a130a0b782d74726163652d62696e120400fffe8012140a0e782d636865636b73756d2d62696e12020102120d0a06782d646f6e6512037965730a070a02703118e209",
		wantHeader: map[string][]string{
			"x-upper":        {"kept"},
			"x-blank":        {""},
			"x-request-cost": {"3"},
			"x-tags":         {"a", "b"},
			"x-trace-bin":    {"\x00\xff\xfe\x80"},
		},
		wantTrailer: map[string][]string{"x-checksum-bin": {"\x01\x02"}, "x-done": {"yes"}},
	}, {
		name:        "error with trailer",
		code:        code.Code_NOT_FOUND,
		msg:         &spb.Status{Code: int32(code.Code_NOT_FOUND), Message: "gone"},
		trailer:     map[string][]string{"x-done": {"no"}},
		body:        "0105b768599c0e120c0a06782d646f6e6512026e6f08051204676f6e65",
		wantTrailer: map[string][]string{"x-done": {"no"}},
	}}
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func deterministic(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func equalMD(a, b map[string][]string) bool {
	return maps.EqualFunc(a, b, slices.Equal)
}

// TestDecodeLegacy decodes bodies that the envelope code before this
// package wrote, and finds what it found in them.
func TestDecodeLegacy(t *testing.T) {
	for _, v := range legacyVectors(t) {
		t.Run(v.name, func(t *testing.T) {
			r, err := Decode(unhex(t, v.body))
			if err != nil {
				t.Fatal(err)
			}
			if r.Bare || r.Code != v.code {
				t.Errorf("Decode = code %v, bare %v; want code %v, enveloped", r.Code, r.Bare, v.code)
			}
			if want := deterministic(t, v.msg); !bytes.Equal(r.Payload, want) {
				t.Errorf("payload %x, want %x", r.Payload, want)
			}
			if !equalMD(r.Header, v.wantHeader) || !equalMD(r.Trailer, v.wantTrailer) {
				t.Errorf("metadata %q, %q; want %q, %q", r.Header, r.Trailer, v.wantHeader, v.wantTrailer)
			}
		})
	}
}

// TestDecodeBare decodes payloads recorded before any envelope: returned
// as they are, with Bare set.
func TestDecodeBare(t *testing.T) {
	for _, body := range [][]byte{
		unhex(t, "0a070a02703118e209"), // paymentResponse()
		deterministic(t, badRequest(t)),
		{},
		nil,
	} {
		r, err := Decode(body)
		if err != nil {
			t.Fatalf("Decode(%x): %v", body, err)
		}
		if !r.Bare || r.Code != code.Code_OK || !bytes.Equal(r.Payload, body) || r.Header != nil || r.Trailer != nil {
			t.Errorf("Decode(%x) = %+v; want it bare", body, r)
		}
	}
}

// TestLegacyCopy pins the copy of the earlier encoder that the benchmarks
// and the fuzz target use to the bytes the original wrote.
func TestLegacyCopy(t *testing.T) {
	for _, v := range legacyVectors(t) {
		body, payload, err := legacyEncode(v.code, v.msg, v.header, v.trailer)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(body); got != v.body {
			t.Errorf("%s: legacyEncode = %s, want %s", v.name, got, v.body)
		}
		got, header, trailer, _, err := legacyOpen(v.code, body)
		if err != nil || !bytes.Equal(got, payload) || !equalMD(header, v.wantHeader) || !equalMD(trailer, v.wantTrailer) {
			t.Errorf("%s: legacyOpen = %x, %q, %q, %v", v.name, got, header, trailer, err)
		}
	}
}

// TestDecodeLegacyCorrupt refuses earlier envelopes that do not vouch for
// their payload.
func TestDecodeLegacyCorrupt(t *testing.T) {
	vs := legacyVectors(t)
	resp := unhex(t, vs[0].body)
	meta := unhex(t, vs[3].body)
	flip := func(b []byte, i int) []byte {
		b = bytes.Clone(b)
		b[i] ^= 1
		return b
	}
	// reseal returns b with a checksum that fits what it holds.
	reseal := func(b []byte) []byte {
		b = bytes.Clone(b)
		sum := legacySum(b[1:2], b[envelopeHeader:])
		b[2], b[3], b[4], b[5] = byte(sum>>24), byte(sum>>16), byte(sum>>8), byte(sum)
		return b
	}
	code17 := bytes.Clone(resp)
	code17[1] = 17
	badMeta := bytes.Clone(meta)
	badMeta[8] = 0x1a // the first entry's tag, now field 3
	for _, c := range []struct {
		name string
		body []byte
		want string // in the error
	}{
		{"flipped code", flip(resp, 1), "checksum"},
		{"flipped checksum", flip(resp, 3), "checksum"},
		{"flipped payload", flip(resp, len(resp)-1), "checksum"},
		{"flipped metadata", flip(meta, 12), "checksum"},
		{"truncated payload", resp[:len(resp)-1], "checksum"},
		{"truncated envelope", resp[:5], "shorter"},
		{"mark alone", []byte{envelopeMetaMark}, "shorter"},
		{"code 17, sealed", reseal(code17), "not a gRPC code"},
		{"metadata length past the end", reseal(append(bytes.Clone(meta[:envelopeHeader]), 0x7f)), "truncated"},
		{"truncated metadata", reseal(meta[:envelopeHeader+20]), "truncated"},
		{"entry of field 3", reseal(badMeta), "metadata is malformed"},
		{"entry without a value", reseal(unhex(t, "010000000000040a020a00")), "entry is malformed"},
	} {
		r, err := Decode(c.body)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Decode(%x) = %+v, %v; want an error about %q", c.name, c.body, r, err, c.want)
		}
	}
}
