package fingerprint_test

import (
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/fingerprint"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// benchRequest returns a CreatePaymentRequest of about 1 KiB, with trace_id
// set if traceID is not empty.
func benchRequest(traceID string) *testv1.CreatePaymentRequest {
	return &testv1.CreatePaymentRequest{
		CustomerId:  "cus_9f8e7d6c5b4a39281706f5e4d3c2b1a0",
		AmountCents: 123456,
		Currency:    "EUR",
		Note:        strings.Repeat("payment for order 12345, ", 38),
		TraceId:     traceID,
	}
}

func BenchmarkFingerprint(b *testing.B) {
	plain := benchRequest("")
	traced := benchRequest("4bf92f3577b34da6a3ce929d0e0e4736")
	if n := proto.Size(traced); n < 1000 || n > 1100 {
		b.Fatalf("request is %d bytes, want about 1 KiB", n)
	}
	h := fingerprint.NewHasher()

	// baseline is the cost of encoding and hashing, without exclusion.
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, err := proto.Marshal(plain)
			if err != nil {
				b.Fatal(err)
			}
			_ = sha256.Sum256(buf)
		}
	})
	// ratio alternates short batches of baseline and Sum on the traced
	// request, so that both see the same machine, and reports Sum's time
	// over the baseline's as x-baseline (the goal is at most 1.2).
	b.Run("ratio", func(b *testing.B) {
		b.ReportAllocs()
		const batch = 64
		var base, sum time.Duration
		for b.Loop() {
			t0 := time.Now()
			for range batch {
				buf, err := proto.Marshal(plain)
				if err != nil {
					b.Fatal(err)
				}
				_ = sha256.Sum256(buf)
			}
			t1 := time.Now()
			for range batch {
				if _, err := h.Sum(traced); err != nil {
					b.Fatal(err)
				}
			}
			base += t1.Sub(t0)
			sum += time.Since(t1)
		}
		b.ReportMetric(float64(sum)/float64(base), "x-baseline")
	})
	// sum hashes a request whose excluded field is not set.
	b.Run("sum", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.Sum(plain); err != nil {
				b.Fatal(err)
			}
		}
	})
	// sum-strip hashes a request whose excluded field is set, so it is
	// left out of a copy.
	b.Run("sum-strip", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.Sum(traced); err != nil {
				b.Fatal(err)
			}
		}
	})
}
