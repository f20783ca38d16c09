package idem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemkit/idem/store"
)

// A recorded outcome's body (store.Outcome.Body, opaque to the stores) is an
// envelope that lets decode vouch for what it replays:
//
//	0x00 | code (1 byte) | CRC-32C of code and payload (4 bytes, big-endian) | payload
//
// where payload is the deterministic encoding of the response (code OK) or
// of the error's google.rpc.Status. An outcome whose handler set response
// metadata records it too:
//
//	0x01 | code | CRC-32C of code and what follows it | uvarint length of meta | meta | payload
//
// where meta holds the header and trailer entries (see appendMetadata). No
// protobuf encoding starts with 0x00 or 0x01 (field number 0 is invalid),
// so the bodies recorded before the envelope existed, which are bare
// payloads, stay recognisable and are still replayed. Bodies of responses
// not cached hold a Loader's reference and are not enveloped.
const (
	envelopeMark     = 0x00
	envelopeMetaMark = 0x01
	envelopeHeader   = 6
)

// maxCode is the largest gRPC status code.
const maxCode = code.Code_UNAUTHENTICATED

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// envelopeSum is the checksum of an envelope's code and payload. The code
// is passed as the one-byte slice of the envelope that holds it, which
// costs no allocation.
func envelopeSum(code, payload []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, code), castagnoli, payload)
}

// encodeOutcome returns the envelope of msg recorded with code and the
// response metadata of r worth recording (see recordable), in one
// allocation, and the payload within it: the bytes every reply sends.
func encodeOutcome(c code.Code, msg proto.Message, header, trailer map[string][]string) (body, payload []byte, err error) {
	if c < 0 || c > maxCode {
		return nil, nil, fmt.Errorf("status code %d is not a gRPC code", c)
	}
	meta := appendMetadata(appendMetadata(nil, metaHeader, header), metaTrailer, trailer)
	head := envelopeHeader
	if len(meta) > 0 {
		head += protowire.SizeVarint(uint64(len(meta))) + len(meta)
	}
	opts := proto.MarshalOptions{Deterministic: true}
	n := opts.Size(msg)
	opts.UseCachedSize = true // sized just above, and unchanged since
	body = make([]byte, envelopeHeader, head+n)
	body[0] = envelopeMark
	if len(meta) > 0 {
		body[0] = envelopeMetaMark
		body = protowire.AppendVarint(body, uint64(len(meta)))
		body = append(body, meta...)
	}
	body, err = opts.MarshalAppend(body, msg)
	if err != nil {
		return nil, nil, err
	}
	payload = body[head:]
	body[1] = byte(c)
	binary.BigEndian.PutUint32(body[2:envelopeHeader], envelopeSum(body[1:2], body[envelopeHeader:]))
	return body, payload, nil
}

// The fields of an envelope's meta: each entry is a message of a key (1)
// and a value (2).
const (
	metaHeader  protowire.Number = 1
	metaTrailer protowire.Number = 2
)

// appendMetadata appends to b the entries of md worth recording, as field
// num, keys sorted so that a response's record does not depend on map
// order.
func appendMetadata(b []byte, num protowire.Number, md map[string][]string) []byte {
	keys := make([]string, 0, len(md))
	for k := range md {
		if recordable(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range md[k] {
			var e []byte
			e = protowire.AppendTag(e, 1, protowire.BytesType)
			e = protowire.AppendString(e, k)
			e = protowire.AppendTag(e, 2, protowire.BytesType)
			e = protowire.AppendString(e, v)
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, e)
		}
	}
	return b
}

// parseMetadata reads the entries appendMetadata wrote.
func parseMetadata(b []byte) (header, trailer map[string][]string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != metaHeader && num != metaTrailer) {
			return nil, nil, errors.New("recorded metadata is malformed")
		}
		b = b[n:]
		e, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, nil, errors.New("recorded metadata is malformed")
		}
		b = b[n:]
		var kv [2]string
		for i := range kv {
			f, t, m := protowire.ConsumeTag(e)
			if m < 0 || t != protowire.BytesType || f != protowire.Number(i+1) {
				return nil, nil, errors.New("recorded metadata entry is malformed")
			}
			v, m2 := protowire.ConsumeString(e[m:])
			if m2 < 0 {
				return nil, nil, errors.New("recorded metadata entry is malformed")
			}
			kv[i], e = v, e[m+m2:]
		}
		md := &header
		if num == metaTrailer {
			md = &trailer
		}
		if *md == nil {
			*md = map[string][]string{}
		}
		(*md)[kv[0]] = append((*md)[kv[0]], kv[1])
	}
	return header, trailer, nil
}

// recordable reports whether response metadata named key is recorded with
// an outcome and replayed: what the handler set of its own, not what
// transports or idem set (grpc- names, pseudo-headers, the content type,
// idem's own headers).
func recordable(key string) bool {
	switch {
	case strings.HasPrefix(key, "grpc-"), strings.HasPrefix(key, ":"):
		return false
	}
	switch key {
	case "content-type", "te", "user-agent", ReplayedHeader, ExpiresHeader, KeyHeader:
		return false
	}
	return true
}

// decode checks a recorded outcome and returns the message to hand back:
// the response, or the google.rpc.Status of an error. It refuses codes that
// are not gRPC codes, envelopes whose code differs from the row's or whose
// checksum fails, and errors whose status carries another code.
//
// A body without an envelope was recorded by an earlier version of idem,
// and no checksum vouches for it. Its response is decoded strictly: it must
// have no unknown fields at any depth, so that the google.rpc.Status of an
// error relabelled as a response (whose fields are foreign to the response
// type) is not replayed as one. Responses replayed as their raw bytes
// (types with maps or extensions) are exempt, as their bytes may carry
// extensions this process does not know; they are only checked to parse.
//
// It also returns the payload, the recorded bytes every reply sends, and
// the response metadata recorded with them.
func decode(m *method, out store.Outcome) (recorded, error) {
	if out.Code > maxCode {
		return recorded{}, fmt.Errorf("recorded status code %d is not a gRPC code", out.Code)
	}
	r, enveloped, err := openEnvelope(out)
	if err != nil {
		return recorded{}, err
	}
	if out.Code != code.Code_OK {
		st := new(spb.Status)
		if err := proto.Unmarshal(r.payload, st); err != nil {
			return recorded{}, err
		}
		if code.Code(st.GetCode()) != out.Code {
			return recorded{}, errors.New("recorded status code does not match its row")
		}
		r.msg = st
		return r, nil
	}
	resp := m.output.New().Interface()
	if err := proto.Unmarshal(r.payload, resp); err != nil {
		return recorded{}, err
	}
	if !m.raw && !enveloped && hasUnknown(resp.ProtoReflect()) {
		return recorded{}, fmt.Errorf("recorded response has fields unknown to %s", m.output.Descriptor().FullName())
	}
	r.msg = resp
	return r, nil
}

// recorded is a decoded outcome.
type recorded struct {
	// msg is the response, or the google.rpc.Status of an error.
	msg proto.Message
	// payload is msg's recorded encoding, which replies send.
	payload []byte
	// header and trailer are the response metadata recorded with it.
	header, trailer map[string][]string
}

// openEnvelope returns the payload of out's body, with its metadata, and
// whether it was enveloped, or an error when the envelope does not vouch
// for it.
func openEnvelope(out store.Outcome) (r recorded, enveloped bool, err error) {
	b := out.Body
	if len(b) == 0 || (b[0] != envelopeMark && b[0] != envelopeMetaMark) {
		return recorded{payload: b}, false, nil
	}
	switch {
	case len(b) < envelopeHeader:
		return recorded{}, true, errors.New("recorded outcome is shorter than its envelope")
	case code.Code(b[1]) != out.Code:
		return recorded{}, true, fmt.Errorf("recorded outcome has code %d, its row %d", b[1], out.Code)
	case binary.BigEndian.Uint32(b[2:envelopeHeader]) != envelopeSum(b[1:2], b[envelopeHeader:]):
		return recorded{}, true, errors.New("recorded outcome fails its checksum")
	}
	rest := b[envelopeHeader:]
	if b[0] == envelopeMetaMark {
		meta, n := protowire.ConsumeBytes(rest)
		if n < 0 {
			return recorded{}, true, errors.New("recorded outcome's metadata is truncated")
		}
		if r.header, r.trailer, err = parseMetadata(meta); err != nil {
			return recorded{}, true, err
		}
		rest = rest[n:]
	}
	r.payload = rest
	return r, true, nil
}

// hasUnknown reports whether m, or a message within it, has unknown fields.
func hasUnknown(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					found = hasUnknown(mv.Message())
					return !found
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				for l, i := v.List(), 0; i < l.Len() && !found; i++ {
					found = hasUnknown(l.Get(i).Message())
				}
			}
		case fd.Message() != nil:
			found = hasUnknown(v.Message())
		}
		return !found
	})
	return found
}
