package fingerprint

import "google.golang.org/protobuf/proto"

// Stripped returns the bytes whose digest is the fingerprint of m.
func Stripped(h *Hasher, m proto.Message) ([]byte, error) {
	return h.appendStripped(nil, m)
}
