package record

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/proto"

	recordv1 "github.com/idemkit/idem/internal/gen/idem/record/v1"
)

// mark is the first byte of a body: a Record's encoding follows it.
const mark = 0x02

// maxCode is the largest status code.
const maxCode = code.Code_UNAUTHENTICATED

// Record is a decoded body.
type Record struct {
	// Code is the status code: OK for a response, else an error's. It is
	// OK, and means nothing, when Bare is set.
	Code code.Code
	// Payload is the deterministic encoding of the response (Code OK) or
	// of the error's google.rpc.Status: the bytes a replay sends.
	Payload []byte
	// Header and Trailer are the response metadata recorded with the
	// outcome, under lowercase names; nil when there was none.
	Header, Trailer map[string][]string
	// Request is the deterministic encoding of the request, kept with the
	// outcome for an operator ([EncodeRequest]); nil when none was.
	Request []byte
	// Bare reports a body recorded before bodies had an envelope: it is
	// the payload alone, with no code, no metadata and no checksum.
	Bare bool
}

// Encode returns the body that records msg, the response (code OK) or the
// google.rpc.Status of an error of that code, with the response metadata
// worth replaying, and the payload: msg's deterministic encoding, the bytes
// a reply sends. msg is encoded once. Metadata names are lowercased; values
// of names equal once lowercased are kept in the order of their names.
func Encode(c code.Code, msg proto.Message, header, trailer map[string][]string) (body, payload []byte, err error) {
	return EncodeRequest(c, msg, header, trailer, nil)
}

// EncodeRequest is [Encode], keeping request, the deterministic encoding
// of the call's request, in the body too (nil keeps none), where only
// [Decode] reads it: replays send the payload alone.
func EncodeRequest(c code.Code, msg proto.Message, header, trailer map[string][]string, request []byte) (body, payload []byte, err error) {
	if c < 0 || c > maxCode {
		return nil, nil, fmt.Errorf("status code %d is not a gRPC code", c)
	}
	payload, err = proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, nil, err
	}
	body, err = seal(c, payload, header, trailer, request)
	if err != nil {
		return nil, nil, err
	}
	return body, payload, nil
}

// seal returns the body of payload recorded with code c (a valid code),
// the recordable entries of header and trailer, and request.
func seal(c code.Code, payload []byte, header, trailer map[string][]string, request []byte) ([]byte, error) {
	rec := &recordv1.Record{
		Code:    int32(c),
		Payload: payload,
		Header:  entries(header),
		Trailer: entries(trailer),
		Request: request,
	}
	rec.Checksum = checksum(c, rec)
	opts := proto.MarshalOptions{Deterministic: true}
	body := make([]byte, 1, 1+opts.Size(rec))
	body[0] = mark
	opts.UseCachedSize = true // sized just above, and unchanged since
	return opts.MarshalAppend(body, rec)
}

// entries returns the recordable entries of md, one per lowercase name,
// sorted by name so that a record does not depend on map order; the values
// of names equal once lowercased follow the order of the names.
func entries(md map[string][]string) []*recordv1.Entry {
	if len(md) == 0 {
		return nil
	}
	keys := make([]string, 0, len(md))
	for k, vs := range md {
		if len(vs) > 0 && recordable(strings.ToLower(k)) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(strings.Compare(strings.ToLower(a), strings.ToLower(b)), strings.Compare(a, b))
	})
	var es []*recordv1.Entry
	for _, k := range keys {
		if name := strings.ToLower(k); len(es) == 0 || es[len(es)-1].Name != name {
			es = append(es, &recordv1.Entry{Name: name})
		}
		e := es[len(es)-1]
		for _, v := range md[k] {
			e.Values = append(e.Values, []byte(v))
		}
	}
	return es
}

// recordable reports whether response metadata named key (lowercase) is
// recorded with an outcome and replayed: what the handler set of its own,
// not what transports or idem set (grpc- names, pseudo-headers, the content
// type, idem's own headers: interceptor.ReplayedHeader, ExpiresHeader and
// KeyHeader).
func recordable(key string) bool {
	switch {
	case strings.HasPrefix(key, "grpc-"), strings.HasPrefix(key, ":"):
		return false
	}
	switch key {
	case "content-type", "te", "user-agent", "idempotent-replayed", "idempotency-key-expires", "idempotency-key":
		return false
	}
	return true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// codeBytes holds each status code as the one byte the checksums take,
// sliced without allocating.
var codeBytes = func() (b [maxCode + 1]byte) {
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// checksum is the CRC-32C of a record with code c (a valid code): its code
// as one byte, then its payload, as the envelopes before it summed them;
// then, if it has metadata, for its header and then its trailer the number
// of entries, and for each entry the length of its name, the name, the
// number of values and each value preceded by its length, every number a
// uvarint; then, if it keeps a request, the request's length and the
// request (with the metadata's framing, empty, before them when it has
// none). The framing is only summed, never parsed.
func checksum(c code.Code, rec *recordv1.Record) uint32 {
	s := crc32.Update(0, castagnoli, codeBytes[c:c+1])
	s = crc32.Update(s, castagnoli, rec.GetPayload())
	if len(rec.GetHeader()) == 0 && len(rec.GetTrailer()) == 0 && len(rec.GetRequest()) == 0 {
		return s
	}
	var n [binary.MaxVarintLen64]byte
	num := func(s uint32, x int) uint32 {
		return crc32.Update(s, castagnoli, binary.AppendUvarint(n[:0], uint64(x)))
	}
	for _, es := range [...][]*recordv1.Entry{rec.GetHeader(), rec.GetTrailer()} {
		s = num(s, len(es))
		for _, e := range es {
			s = num(s, len(e.GetName()))
			s = crc32.Update(s, castagnoli, []byte(e.GetName()))
			s = num(s, len(e.GetValues()))
			for _, v := range e.GetValues() {
				s = num(s, len(v))
				s = crc32.Update(s, castagnoli, v)
			}
		}
	}
	if req := rec.GetRequest(); len(req) > 0 {
		s = num(s, len(req))
		s = crc32.Update(s, castagnoli, req)
	}
	return s
}

// Decode reads a body in any form idem has recorded (see the package
// documentation). It returns an error for a body whose envelope does not
// vouch for it: truncated, malformed, failing its checksum, or with a code
// that is not a gRPC code. A bare payload (an empty body among them) is
// returned as it is, with Bare set.
func Decode(body []byte) (Record, error) {
	if len(body) == 0 || body[0] > mark {
		return Record{Payload: body, Bare: true}, nil
	}
	if body[0] != mark {
		return decodeEnvelope(body)
	}
	var rec recordv1.Record
	if err := proto.Unmarshal(body[1:], &rec); err != nil {
		return Record{}, fmt.Errorf("recorded outcome is malformed: %w", err)
	}
	c := code.Code(rec.GetCode())
	if c < 0 || c > maxCode {
		return Record{}, fmt.Errorf("recorded status code %d is not a gRPC code", rec.GetCode())
	}
	if rec.GetChecksum() != checksum(c, &rec) {
		return Record{}, errors.New("recorded outcome fails its checksum")
	}
	r := Record{Code: c, Payload: rec.GetPayload(), Request: rec.GetRequest()}
	for _, e := range rec.GetHeader() {
		for _, v := range e.GetValues() {
			r.Header = add(r.Header, e.GetName(), string(v))
		}
	}
	for _, e := range rec.GetTrailer() {
		for _, v := range e.GetValues() {
			r.Trailer = add(r.Trailer, e.GetName(), string(v))
		}
	}
	return r, nil
}

// add appends value v of name to md, under the lowercase name, if that
// name is recordable, allocating md if needed.
func add(md map[string][]string, name, v string) map[string][]string {
	name = strings.ToLower(name)
	if !recordable(name) {
		return md
	}
	if md == nil {
		md = map[string][]string{}
	}
	md[name] = append(md[name], v)
	return md
}
