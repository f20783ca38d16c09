package idem

import (
	"bytes"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
)

func TestDecode(t *testing.T) {
	ms := newMethods(nil)
	decoded := ms.lookup(testv1.PaymentService_CreatePayment_FullMethodName)
	raw := ms.lookup(testv1.TestService_Do_FullMethodName)

	resp := &testv1.CreatePaymentResponse{Payment: &testv1.Payment{Id: "p1", AmountCents: 1250}}
	respBody, _, err := encodeOutcome(code.Code_OK, resp, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := &spb.Status{Code: int32(code.Code_INVALID_ARGUMENT), Message: "invalid payment"}
	errBody, errPayload, err := encodeOutcome(code.Code_INVALID_ARGUMENT, st, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	flip := func(b []byte, i int) []byte {
		b = bytes.Clone(b)
		b[i] ^= 1
		return b
	}
	legacyResp, _ := proto.Marshal(resp)
	legacyStatus, _ := proto.Marshal(st)
	legacyWithUnknown := append(bytes.Clone(legacyResp), 0xf8, 0x07, 0x01) // field 127, varint 1
	do := &testv1.DoResponse{Value: "v", Labels: map[string]string{"a": "1", "b": "2", "c": "3"}}
	doBody, doPayload, err := encodeOutcome(code.Code_OK, do, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	legacyDo, _ := proto.Marshal(&testv1.DoResponse{Value: "v", Labels: map[string]string{"a": "1"}})
	legacyDoWithUnknown := append(legacyDo, 0xf8, 0x07, 0x01)

	for _, c := range []struct {
		name string
		m    *method
		out  store.Outcome
		ok   bool
	}{
		{"response", decoded, store.Outcome{Code: code.Code_OK, Body: respBody}, true},
		{"raw response", raw, store.Outcome{Code: code.Code_OK, Body: doBody}, true},
		{"raw response of another type", raw, store.Outcome{Code: code.Code_OK, Body: respBody}, false},
		{"error", decoded, store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: errBody}, true},
		{"error relabelled OK", decoded, store.Outcome{Code: code.Code_OK, Body: errBody}, false},
		{"error relabelled OK, raw", raw, store.Outcome{Code: code.Code_OK, Body: errBody}, false},
		{"error relabelled NOT_FOUND", decoded, store.Outcome{Code: code.Code_NOT_FOUND, Body: errBody}, false},
		{"response relabelled INVALID_ARGUMENT", decoded, store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: respBody}, false},
		{"code 17", decoded, store.Outcome{Code: 17, Body: respBody}, false},
		{"code 99", decoded, store.Outcome{Code: 99, Body: errBody}, false},
		{"flipped code", decoded, store.Outcome{Code: code.Code_OK, Body: flip(respBody, 1)}, false},
		{"flipped checksum", decoded, store.Outcome{Code: code.Code_OK, Body: flip(respBody, 3)}, false},
		{"flipped payload", decoded, store.Outcome{Code: code.Code_OK, Body: flip(respBody, len(respBody)-1)}, false},
		{"flipped payload, raw", raw, store.Outcome{Code: code.Code_OK, Body: flip(doBody, len(doBody)-1)}, false},
		{"truncated envelope", decoded, store.Outcome{Code: code.Code_OK, Body: respBody[:5]}, false},
		{"truncated payload", decoded, store.Outcome{Code: code.Code_OK, Body: respBody[:len(respBody)-1]}, false},

		{"earlier response", decoded, store.Outcome{Code: code.Code_OK, Body: legacyResp}, true},
		{"earlier empty response", decoded, store.Outcome{Code: code.Code_OK}, true},
		{"earlier error", decoded, store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: legacyStatus}, true},
		{"earlier error relabelled OK", decoded, store.Outcome{Code: code.Code_OK, Body: legacyStatus}, false},
		{"earlier response with unknown fields", decoded, store.Outcome{Code: code.Code_OK, Body: legacyWithUnknown}, false},
		{"earlier response with unknown fields, raw", raw, store.Outcome{Code: code.Code_OK, Body: legacyDoWithUnknown}, true},
		{"earlier error with code 99", decoded, store.Outcome{Code: 99, Body: legacyStatus}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec, err := decode(c.m, c.out)
			if (err == nil) != c.ok {
				t.Fatalf("decode = %v, %v; want accepted %v", rec.msg, err, c.ok)
			}
		})
	}

	// Replies carry exactly the payload.
	rec, err := decode(raw, store.Outcome{Code: code.Code_OK, Body: doBody})
	if sent, _ := proto.Marshal(rawMessage(raw, rec.payload)); err != nil || !bytes.Equal(sent, doPayload) {
		t.Fatalf("raw replay sends %x (%v), want %x", sent, err, doPayload)
	}
	rec, err = decode(decoded, store.Outcome{Code: code.Code_INVALID_ARGUMENT, Body: errBody})
	if got, _ := proto.Marshal(rec.msg); err != nil || !bytes.Equal(got, errPayload) {
		t.Fatalf("error replay %x (%v), want %x", got, err, errPayload)
	}
	if _, _, err := encodeOutcome(99, st, nil, nil, nil); err == nil {
		t.Fatal("encodeOutcome recorded code 99")
	}
}

func BenchmarkEncodeOutcome(b *testing.B) {
	resp := &testv1.CreatePaymentResponse{Payment: &testv1.Payment{Id: "3f0c1d2e-7b9a-4c5d-8e6f-0a1b2c3d4e5f", CustomerId: "cus_1", AmountCents: 1250, Currency: "EUR"}}
	b.Run("envelope", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := encodeOutcome(code.Code_OK, resp, nil, nil, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare", func(b *testing.B) { // the encoding before the envelope
		b.ReportAllocs()
		for b.Loop() {
			if _, err := (proto.MarshalOptions{Deterministic: true}).Marshal(resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}
