package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/encoding/protowire"
)

// The envelopes of earlier versions (see the package documentation): a
// mark, the code, and the CRC-32C of the code and all that follows, before
// the rest.
const (
	envelopeMark     = 0x00
	envelopeMetaMark = 0x01
	envelopeHeader   = 6
)

// The fields of an envelope's metadata: each entry is a message of a name
// (1) and a value (2).
const (
	envelopeMetaHeader  protowire.Number = 1
	envelopeMetaTrailer protowire.Number = 2
)

// decodeEnvelope reads an envelope of an earlier version, marked 0x00 or
// 0x01.
func decodeEnvelope(b []byte) (Record, error) {
	switch {
	case len(b) < envelopeHeader:
		return Record{}, errors.New("recorded outcome is shorter than its envelope")
	case code.Code(b[1]) > maxCode:
		return Record{}, fmt.Errorf("recorded status code %d is not a gRPC code", b[1])
	case binary.BigEndian.Uint32(b[2:envelopeHeader]) != crc32.Update(crc32.Update(0, castagnoli, b[1:2]), castagnoli, b[envelopeHeader:]):
		return Record{}, errors.New("recorded outcome fails its checksum")
	}
	r := Record{Code: code.Code(b[1])}
	rest := b[envelopeHeader:]
	if b[0] == envelopeMetaMark {
		meta, n := protowire.ConsumeBytes(rest)
		if n < 0 {
			return Record{}, errors.New("recorded outcome's metadata is truncated")
		}
		var err error
		if r.Header, r.Trailer, err = decodeEnvelopeMetadata(meta); err != nil {
			return Record{}, err
		}
		rest = rest[n:]
	}
	r.Payload = rest
	return r, nil
}

// decodeEnvelopeMetadata reads an envelope's metadata: entries, each a
// field 1 (header) or 2 (trailer) holding a name and a value.
func decodeEnvelopeMetadata(b []byte) (header, trailer map[string][]string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != envelopeMetaHeader && num != envelopeMetaTrailer) {
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
		if num == envelopeMetaHeader {
			header = add(header, kv[0], kv[1])
		} else {
			trailer = add(trailer, kv[0], kv[1])
		}
	}
	return header, trailer, nil
}
