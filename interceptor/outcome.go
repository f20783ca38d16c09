package interceptor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
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
// of the error's google.rpc.Status. No protobuf encoding starts with 0x00
// (field number 0 is invalid), so the bodies recorded before the envelope
// existed, which are bare payloads, stay recognisable and are still
// replayed. Bodies of responses not cached hold a Loader's reference and
// are not enveloped.
const (
	envelopeMark   = 0x00
	envelopeHeader = 6
)

// maxCode is the largest gRPC status code.
const maxCode = codes.Unauthenticated

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// envelopeSum is the checksum of an envelope's code and payload. The code
// is passed as the one-byte slice of the envelope that holds it, which
// costs no allocation.
func envelopeSum(code, payload []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, code), castagnoli, payload)
}

// encodeOutcome returns the envelope of msg recorded with code, in one
// allocation, and the payload within it: the bytes every reply sends.
func encodeOutcome(code codes.Code, msg proto.Message) (body, payload []byte, err error) {
	if code > maxCode {
		return nil, nil, fmt.Errorf("status code %d is not a gRPC code", code)
	}
	opts := proto.MarshalOptions{Deterministic: true}
	n := opts.Size(msg)
	opts.UseCachedSize = true // sized just above, and unchanged since
	body, err = opts.MarshalAppend(make([]byte, envelopeHeader, envelopeHeader+n), msg)
	if err != nil {
		return nil, nil, err
	}
	payload = body[envelopeHeader:]
	body[0] = envelopeMark
	body[1] = byte(code)
	binary.BigEndian.PutUint32(body[2:envelopeHeader], envelopeSum(body[1:2], payload))
	return body, payload, nil
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
// It also returns the payload, the recorded bytes every reply sends.
func decode(m *method, out store.Outcome) (msg proto.Message, payload []byte, err error) {
	if out.Code > maxCode {
		return nil, nil, fmt.Errorf("recorded status code %d is not a gRPC code", out.Code)
	}
	payload, enveloped, err := openEnvelope(out)
	if err != nil {
		return nil, nil, err
	}
	if out.Code != codes.OK {
		st := new(spb.Status)
		if err := proto.Unmarshal(payload, st); err != nil {
			return nil, nil, err
		}
		if codes.Code(st.GetCode()) != out.Code {
			return nil, nil, errors.New("recorded status code does not match its row")
		}
		return st, payload, nil
	}
	resp := m.output.New().Interface()
	if err := proto.Unmarshal(payload, resp); err != nil {
		return nil, nil, err
	}
	if !m.raw && !enveloped && hasUnknown(resp.ProtoReflect()) {
		return nil, nil, fmt.Errorf("recorded response has fields unknown to %s", m.output.Descriptor().FullName())
	}
	return resp, payload, nil
}

// openEnvelope returns the payload of out's body and whether it was
// enveloped, or an error when the envelope does not vouch for it.
func openEnvelope(out store.Outcome) (payload []byte, enveloped bool, err error) {
	b := out.Body
	if len(b) == 0 || b[0] != envelopeMark {
		return b, false, nil
	}
	switch {
	case len(b) < envelopeHeader:
		return nil, true, errors.New("recorded outcome is shorter than its envelope")
	case codes.Code(b[1]) != out.Code:
		return nil, true, fmt.Errorf("recorded outcome has code %d, its row %d", b[1], out.Code)
	case binary.BigEndian.Uint32(b[2:envelopeHeader]) != envelopeSum(b[1:2], b[envelopeHeader:]):
		return nil, true, errors.New("recorded outcome fails its checksum")
	}
	return b[envelopeHeader:], true, nil
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
