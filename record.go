package idem

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemkit/idem/internal/record"
	"github.com/idemkit/idem/store"
)

// A recorded outcome's body (store.Outcome.Body, opaque to the stores) is
// written by package internal/record: a mark byte and an idem.record.v1
// Record, which holds the status code, the payload (the deterministic
// encoding of the response, or of the error's google.rpc.Status), the
// response metadata worth recording, and a checksum that lets decode vouch
// for what it replays. Bodies written by earlier versions of idem (two
// hand-written envelopes, and bare payloads) are still read. Bodies of
// responses not cached hold a Loader's reference and are not enveloped.

// encodeOutcome returns the body that records msg with code c, the
// response metadata worth recording and request (the request kept for an
// operator, MethodPolicy.KeepRequest; nil for none), and the payload
// within it: the bytes every reply sends.
func encodeOutcome(c code.Code, msg proto.Message, header, trailer map[string][]string, request []byte) (body, payload []byte, err error) {
	return record.EncodeRequest(c, msg, header, trailer, request)
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
	if out.Code < 0 || out.Code > code.Code_UNAUTHENTICATED {
		return recorded{}, fmt.Errorf("recorded status code %d is not a gRPC code", out.Code)
	}
	rec, err := record.Decode(out.Body)
	if err != nil {
		return recorded{}, err
	}
	enveloped := !rec.Bare
	if enveloped && rec.Code != out.Code {
		return recorded{}, fmt.Errorf("recorded outcome has code %d, its row %d", rec.Code, out.Code)
	}
	r := recorded{payload: rec.Payload, header: rec.Header, trailer: rec.Trailer}
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
