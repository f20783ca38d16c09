package record

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	recordv1 "github.com/idemkit/idem/internal/gen/idem/record/v1"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

func TestRoundTrip(t *testing.T) {
	header := map[string][]string{
		"x-tags":       {"a", "b"},
		"x-trace-bin":  {"\x00\xff\xfe\x80", ""},
		"X-Mixed":      {"upper"},
		"x-mixed":      {"lower"},
		"content-type": {"application/grpc"},
		"grpc-status":  {"0"},
		":status":      {"200"},
		"x-empty":      {},
	}
	trailer := map[string][]string{"x-checksum-bin": {"\x01\x02"}, "Idempotent-Replayed": {"true"}}
	for _, c := range []struct {
		name                    string
		code                    code.Code
		msg                     proto.Message
		header, trailer         map[string][]string
		wantHeader, wantTrailer map[string][]string
	}{
		{name: "response", code: code.Code_OK, msg: paymentResponse()},
		{name: "empty response", code: code.Code_OK, msg: &testv1.CreatePaymentResponse{}},
		{name: "map response", code: code.Code_OK, msg: &testv1.DoResponse{Value: "v", Labels: map[string]string{"b": "2", "a": "1", "c": "3"}}},
		{name: "error", code: code.Code_INVALID_ARGUMENT, msg: badRequest(t)},
		{name: "unauthenticated", code: code.Code_UNAUTHENTICATED, msg: &spb.Status{Code: 16}},
		{
			name: "metadata", code: code.Code_OK, msg: paymentResponse(),
			header: header, trailer: trailer,
			wantHeader: map[string][]string{
				"x-tags":      {"a", "b"},
				"x-trace-bin": {"\x00\xff\xfe\x80", ""},
				"x-mixed":     {"upper", "lower"},
			},
			wantTrailer: map[string][]string{"x-checksum-bin": {"\x01\x02"}},
		},
		{name: "only unrecordable metadata", code: code.Code_NOT_FOUND, msg: &spb.Status{Code: 5}, header: map[string][]string{"grpc-x": {"1"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, payload, err := Encode(c.code, c.msg, c.header, c.trailer)
			if err != nil {
				t.Fatal(err)
			}
			if body[0] != mark {
				t.Errorf("body starts %#x, want %#x", body[0], mark)
			}
			if want := deterministic(t, c.msg); !bytes.Equal(payload, want) {
				t.Errorf("payload %x, want %x", payload, want)
			}
			r, err := Decode(body)
			if err != nil {
				t.Fatal(err)
			}
			if r.Bare || r.Code != c.code || !bytes.Equal(r.Payload, payload) {
				t.Errorf("Decode = %+v; want code %v, payload %x", r, c.code, payload)
			}
			if !equalMD(r.Header, c.wantHeader) || !equalMD(r.Trailer, c.wantTrailer) {
				t.Errorf("metadata %q, %q; want %q, %q", r.Header, r.Trailer, c.wantHeader, c.wantTrailer)
			}
			// The record's own encoding: one entry per name, sorted.
			var rec recordv1.Record
			if err := proto.Unmarshal(body[1:], &rec); err != nil {
				t.Fatal(err)
			}
			for _, es := range [][]*recordv1.Entry{rec.GetHeader(), rec.GetTrailer()} {
				for i := 1; i < len(es); i++ {
					if es[i-1].GetName() >= es[i].GetName() {
						t.Errorf("entries %q then %q, want sorted and distinct", es[i-1].GetName(), es[i].GetName())
					}
				}
			}
		})
	}
}

// TestEncodeDeterministic: a record does not depend on map order.
func TestEncodeDeterministic(t *testing.T) {
	msg := &testv1.DoResponse{Value: "v", Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}}
	header := map[string][]string{"x-a": {"1"}, "x-b": {"2"}, "X-A": {"0"}, "x-c": {"3"}, "x-d": {"4"}}
	first, _, err := Encode(code.Code_OK, msg, header, header)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		body, _, err := Encode(code.Code_OK, msg, header, header)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(body, first) {
			t.Fatalf("Encode = %x, then %x", first, body)
		}
	}
}

func TestEncodeRefusesCodes(t *testing.T) {
	for _, c := range []code.Code{-1, 17, 99} {
		if body, _, err := Encode(c, &spb.Status{Code: int32(c)}, nil, nil); err == nil {
			t.Errorf("Encode(code %d) = %x, want an error", c, body)
		}
	}
}

// TestDecodeCorrupt refuses records that do not vouch for themselves.
func TestDecodeCorrupt(t *testing.T) {
	body, _, err := Encode(code.Code_OK, paymentResponse(),
		map[string][]string{"x-trace-bin": {"\x00\xff"}}, map[string][]string{"x-done": {"yes"}})
	if err != nil {
		t.Fatal(err)
	}
	var rec recordv1.Record
	if err := proto.Unmarshal(body[1:], &rec); err != nil {
		t.Fatal(err)
	}
	// edit returns body with rec changed by f, its checksum left as it was
	// unless f sets it.
	edit := func(f func(*recordv1.Record)) []byte {
		r := proto.Clone(&rec).(*recordv1.Record)
		f(r)
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return append([]byte{mark}, b...)
	}
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"checksum", edit(func(r *recordv1.Record) { r.Checksum ^= 1 }), "checksum"},
		{"no checksum", edit(func(r *recordv1.Record) { r.Checksum = 0 }), "checksum"},
		{"code", edit(func(r *recordv1.Record) { r.Code = int32(code.Code_NOT_FOUND) }), "checksum"},
		{"payload", edit(func(r *recordv1.Record) { r.Payload[0] ^= 1 }), "checksum"},
		{"header value", edit(func(r *recordv1.Record) { r.Header[0].Values[0][1] ^= 1 }), "checksum"},
		{"header name", edit(func(r *recordv1.Record) { r.Header[0].Name = "x-trace-bim" }), "checksum"},
		{"header moved to the trailer", edit(func(r *recordv1.Record) { r.Trailer, r.Header = append(r.Trailer, r.Header...), nil }), "checksum"},
		{"value moved to the next entry", edit(func(r *recordv1.Record) {
			r.Header = append(r.Header, &recordv1.Entry{Name: "x-trace-bin"})
			r.Header[0].Values, r.Header[1].Values = nil, r.Header[0].Values
		}), "checksum"},
		{"code 17", edit(func(r *recordv1.Record) { r.Code = 17 }), "not a gRPC code"},
		{"code -1", edit(func(r *recordv1.Record) { r.Code = -1 }), "not a gRPC code"},
		{"mark alone", []byte{mark}, "checksum"},
		{"not protobuf", []byte{mark, 0xff}, "malformed"},
		{"name not UTF-8", bytes.Replace(body, []byte("x-trace-bin"), []byte("x-trace-bi\xff"), 1), "malformed"},
	} {
		r, err := Decode(c.body)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Decode(%x) = %+v, %v; want an error about %q", c.name, c.body, r, err, c.want)
		}
	}
	// Every truncation is refused: cut within a field, it does not parse;
	// cut between fields, the checksum is missing or does not fit.
	for i := 1; i < len(body); i++ {
		if r, err := Decode(body[:i]); err == nil {
			t.Errorf("Decode(%x), %d of %d bytes, = %+v; want an error", body[:i], i, len(body), r)
		}
	}
}

// TestRequestKept: a request kept with an outcome comes back from Decode,
// beside the payload and metadata, and is under the checksum; a record
// without one reads back none.
func TestRequestKept(t *testing.T) {
	req := deterministic(t, &testv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 1250})
	for _, md := range []map[string][]string{nil, {"x-order-id": {"o-9"}}} {
		body, payload, err := EncodeRequest(code.Code_OK, paymentResponse(), md, nil, req)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Decode(body)
		if err != nil || !bytes.Equal(r.Request, req) || !bytes.Equal(r.Payload, payload) || !equalMD(r.Header, md) {
			t.Fatalf("Decode = %+v, %v; want the request %x, the payload and metadata %q", r, err, req, md)
		}
		var rec recordv1.Record
		if err := proto.Unmarshal(body[1:], &rec); err != nil {
			t.Fatal(err)
		}
		rec.Request[0] ^= 1
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := Decode(append([]byte{mark}, b...)); err == nil || !strings.Contains(err.Error(), "checksum") {
			t.Errorf("a changed request: Decode = %+v, %v; want the checksum to refuse it", r, err)
		}
	}
	body, _, err := Encode(code.Code_OK, paymentResponse(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := Decode(body); err != nil || r.Request != nil {
		t.Errorf("a record without a request: Decode = %+v, %v; want no request", r, err)
	}
}

// TestChecksumAsBefore: without metadata, a record's checksum is the one
// the envelope before it held, the CRC-32C of the code byte and payload.
func TestChecksumAsBefore(t *testing.T) {
	for _, v := range legacyVectors(t)[:3] {
		old := unhex(t, v.body)
		body, _, err := Encode(v.code, v.msg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var rec recordv1.Record
		if err := proto.Unmarshal(body[1:], &rec); err != nil {
			t.Fatal(err)
		}
		if want := uint32(old[2])<<24 | uint32(old[3])<<16 | uint32(old[4])<<8 | uint32(old[5]); rec.GetChecksum() != want {
			t.Errorf("%s: checksum %#x, the envelope's %#x", v.name, rec.GetChecksum(), want)
		}
	}
}

func TestRecordable(t *testing.T) {
	for key, want := range map[string]bool{
		"x-custom":                true,
		"x-custom-bin":            true,
		"location":                true,
		"grpc-status":             false,
		"grpc-message":            false,
		":status":                 false,
		"content-type":            false,
		"te":                      false,
		"user-agent":              false,
		"idempotency-key":         false,
		"idempotent-replayed":     false,
		"idempotency-key-expires": false,
	} {
		if got := recordable(key); got != want {
			t.Errorf("recordable(%q) = %v, want %v", key, got, want)
		}
	}
}
