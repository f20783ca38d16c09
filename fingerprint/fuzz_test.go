package fingerprint_test

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/fingerprint"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// FuzzSum decodes arbitrary bytes, unknown fields and all, into the payments
// example's request and into a message with maps, nesting and excluded
// fields at several depths, and fingerprints whatever decodes. Sum must not
// panic or fail on a message that decoded; its result must be the digest of
// the reference encoding without the excluded fields; equal messages must
// get equal fingerprints; and changing an excluded field must not change
// the fingerprint.
//
// The seed corpus is in testdata/fuzz/FuzzSum.
func FuzzSum(f *testing.F) {
	f.Add([]byte{})
	f.Add(mustMarshal(f, &testv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 1250, Currency: "EUR", TraceId: "t"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []proto.Message{new(testv1.CreatePaymentRequest), new(testv1.Everything)} {
			if proto.Unmarshal(data, m) != nil {
				continue
			}
			sum, err := fingerprint.Sum(m)
			if err != nil {
				t.Fatalf("Sum of a decoded %T: %v", m, err)
			}
			if len(sum) != fingerprint.Size || sum[0] != fingerprint.Version {
				t.Fatalf("fingerprint %x: want %d bytes starting with version %d", sum, fingerprint.Size, fingerprint.Version)
			}
			digest := sha256.Sum256(referenceStripped(t, m, nil))
			if !bytes.Equal(sum[1:], digest[:]) {
				t.Fatalf("fingerprint of %T %x is not the digest of its reference encoding", m, data)
			}

			// Equal messages, however they were built, hash alike.
			for _, equal := range []proto.Message{proto.Clone(m), redecoded(t, m)} {
				if !proto.Equal(m, equal) {
					continue
				}
				if again, err := fingerprint.Sum(equal); err != nil || !bytes.Equal(again, sum) {
					t.Fatalf("equal %T messages: fingerprints %x and %x (%v)", m, sum, again, err)
				}
			}

			// Excluded fields do not count.
			changed := proto.Clone(m)
			setExcluded(changed)
			if again, err := fingerprint.Sum(changed); err != nil || !bytes.Equal(again, sum) {
				t.Fatalf("%T with other excluded fields: fingerprint %x, want %x (%v)", m, again, sum, err)
			}
		}
	})
}

// redecoded returns m decoded again from its deterministic encoding.
func redecoded(t *testing.T, m proto.Message) proto.Message {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatalf("encode %T: %v", m, err)
	}
	c := m.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(b, c); err != nil {
		t.Fatalf("decode %T from its own encoding: %v", m, err)
	}
	return c
}

// setExcluded changes every excluded field of m, at every depth, without
// changing whether the messages that hold them are present.
func setExcluded(m proto.Message) {
	switch m := m.(type) {
	case *testv1.CreatePaymentRequest:
		m.TraceId += "-retry"
	case *testv1.Everything:
		m.RequestId += "-retry"
		if m.Inner != nil {
			m.Inner.Secret += "-retry"
		}
		for _, in := range m.Inners {
			if in != nil {
				in.Secret += "-retry"
			}
		}
		for _, in := range m.ByName {
			if in != nil {
				in.Secret += "-retry"
			}
		}
	}
}

func mustMarshal(f *testing.F, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	return b
}
