package record

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/proto"
)

// The benchmarks compare this package with the envelope code before it
// (legacy_test.go), in the same run, for a small response without and with
// response metadata, and an error with details.
type benchCase struct {
	name            string
	code            code.Code
	msg             proto.Message
	header, trailer map[string][]string
}

func benchCases(b *testing.B) []benchCase {
	return []benchCase{
		{name: "response", code: code.Code_OK, msg: paymentResponse()},
		{name: "metadata", code: code.Code_OK, msg: paymentResponse(),
			header:  map[string][]string{"x-request-cost": {"3"}, "x-trace-bin": {"\x00\xff\xfe\x80"}},
			trailer: map[string][]string{"x-done": {"yes"}}},
		{name: "error", code: code.Code_INVALID_ARGUMENT, msg: badRequest(b)},
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, c := range benchCases(b) {
		b.Run(c.name+"/legacy", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := legacyEncode(c.code, c.msg, c.header, c.trailer); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/record", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := Encode(c.code, c.msg, c.header, c.trailer); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecode reads a body: legacy is the earlier reader on the
// earlier envelope, record this package on its own form, and
// record-of-legacy this package on the earlier envelope.
func BenchmarkDecode(b *testing.B) {
	for _, c := range benchCases(b) {
		old, _, err := legacyEncode(c.code, c.msg, c.header, c.trailer)
		if err != nil {
			b.Fatal(err)
		}
		body, _, err := Encode(c.code, c.msg, c.header, c.trailer)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name+"/legacy", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, _, _, err := legacyOpen(c.code, old); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/record", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(body); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/record-of-legacy", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(old); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
