package fingerprint

import (
	"bytes"

	"google.golang.org/protobuf/proto"
)

// Stripped returns the bytes whose digest is the fingerprint of m.
func Stripped(h *Hasher, m proto.Message) ([]byte, error) {
	return h.stripped(m)
}

// WireStripped returns the encoding of m without its excluded fields as
// stripWire alone computes it, and false if Sum does not use stripWire for
// the type of m.
func WireStripped(h *Hasher, m proto.Message) ([]byte, bool, error) {
	rm := m.ProtoReflect()
	p := h.plan(rm.Descriptor())
	if !p.wire {
		return nil, false, nil
	}
	b, err := marshalOptions.Marshal(m)
	if err != nil {
		return nil, true, err
	}
	out, err := stripWire(nil, b, p.firstOp(b), rm, p)
	return out, true, err
}

// CopyStripped returns the encoding of m without its excluded fields as
// Sum computes it where it cannot use stripWire: from a stripped copy.
func CopyStripped(h *Hasher, m proto.Message) ([]byte, error) {
	rm := m.ProtoReflect()
	b, err := h.encodeCopy(m, rm, h.plan(rm.Descriptor()), new(scratch))
	return bytes.Clone(b), err
}
