package record

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/code"
)

// FuzzDecode feeds arbitrary bodies, as a corrupt or foreign row would hold
// them, to Decode. It must not panic. An earlier envelope (0x00, 0x01) must
// be accepted exactly when the earlier reader (legacyOpen) accepts it with
// a gRPC code, and read as it read it, less the metadata a replay does not
// send. A bare payload comes back as it is. Whatever else Decode accepts,
// sealed again, decodes to the same record, and seals to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, v := range legacyVectors(f) {
		f.Add(unhex(f, v.body))
		body, _, err := Encode(v.code, v.msg, v.header, v.trailer)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	f.Add([]byte{})
	f.Add([]byte{mark})
	f.Add(unhex(f, "0a070a02703118e209"))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := Decode(body)
		if len(body) > 0 && body[0] <= envelopeMetaMark {
			var rowCode code.Code
			if len(body) > 1 {
				rowCode = code.Code(body[1])
			}
			payload, header, trailer, _, lerr := legacyOpen(rowCode, body)
			if lerrOK := lerr == nil && rowCode <= maxCode; lerrOK != (err == nil) {
				t.Fatalf("Decode(%x): %v; the earlier reader: %v (code %d)", body, err, lerr, rowCode)
			}
			if err == nil && (r.Bare || r.Code != rowCode || !bytes.Equal(r.Payload, payload) ||
				!equalMD(r.Header, replayed(header)) || !equalMD(r.Trailer, replayed(trailer))) {
				t.Fatalf("Decode(%x) = %+v; the earlier reader: %x, %q, %q", body, r, payload, header, trailer)
			}
		}
		if err != nil {
			return
		}
		if r.Bare {
			if (len(body) > 0 && body[0] <= mark) || !bytes.Equal(r.Payload, body) || r.Code != code.Code_OK || r.Header != nil || r.Trailer != nil {
				t.Fatalf("Decode(%x) = %+v, bare", body, r)
			}
			return
		}
		again, err := seal(r.Code, r.Payload, r.Header, r.Trailer, r.Request)
		if err != nil {
			t.Fatalf("seal(%+v): %v", r, err)
		}
		r2, err := Decode(again)
		if err != nil {
			t.Fatalf("Decode(seal(%+v)): %v", r, err)
		}
		if r2.Bare || r2.Code != r.Code || !bytes.Equal(r2.Payload, r.Payload) || !bytes.Equal(r2.Request, r.Request) || !equalMD(r2.Header, r.Header) || !equalMD(r2.Trailer, r.Trailer) {
			t.Fatalf("Decode(seal(%+v)) = %+v", r, r2)
		}
		if third, err := seal(r2.Code, r2.Payload, r2.Header, r2.Trailer, r2.Request); err != nil || !bytes.Equal(third, again) {
			t.Fatalf("seal(%+v) = %x, %v; then %x", r2, again, err, third)
		}
	})
}

// replayed returns the entries of md a replay sends, the values of names
// equal once lowercased in the order of their names.
func replayed(md map[string][]string) map[string][]string {
	var out map[string][]string
	for _, k := range slices.Sorted(maps.Keys(md)) {
		for _, v := range md[k] {
			out = add(out, k, v)
		}
	}
	return out
}

// FuzzEncode records arbitrary payloads, metadata and requests (v2): what
// Decode reads back is what was sealed, less the metadata a replay does not send, names
// lowercased.
func FuzzEncode(f *testing.F) {
	f.Add(uint8(0), []byte{0x0a, 0x00}, "x-a", "1", "X-A", []byte{0xff})
	f.Add(uint8(16), []byte{}, "grpc-x", "", "x-bin", []byte{})
	f.Fuzz(func(t *testing.T, c uint8, payload []byte, k1, v1, k2 string, v2 []byte) {
		header := map[string][]string{k1: {v1}, k2: {string(v2), v1}}
		trailer := map[string][]string{k2: {v1}}
		if code.Code(c) > maxCode {
			return
		}
		body, err := seal(code.Code(c), payload, header, trailer, v2)
		if err != nil {
			// Only a name that is not UTF-8 cannot be recorded.
			if utf8.ValidString(strings.ToLower(k1)) && utf8.ValidString(strings.ToLower(k2)) {
				t.Fatalf("seal: %v", err)
			}
			return
		}
		r, err := Decode(body)
		if err != nil {
			t.Fatalf("Decode(seal(%d, %x, %q, %q)): %v", c, payload, header, trailer, err)
		}
		if r.Bare || r.Code != code.Code(c) || !bytes.Equal(r.Payload, payload) || !bytes.Equal(r.Request, v2) ||
			!equalMD(r.Header, replayed(header)) || !equalMD(r.Trailer, replayed(trailer)) {
			t.Fatalf("Decode(seal(%d, %x, %q, %q)) = %+v", c, payload, header, trailer, r)
		}
	})
}
