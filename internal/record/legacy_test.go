package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The envelope code of idem before this package, copied from
// interceptor/outcome.go (encodeOutcome, appendMetadata, openEnvelope and
// parseMetadata) as the benchmarks' baseline and the fuzz target's
// reference reader. Only the types differ: gRPC's codes.Code and
// metadata.MD became code.Code and map[string][]string, and MD.Append,
// which lowercases the name, is spelled out. TestLegacyCopy pins it to
// bytes that interceptor/outcome.go wrote.

func legacySum(code, payload []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, code), castagnoli, payload)
}

func legacyEncode(c code.Code, msg proto.Message, header, trailer map[string][]string) (body, payload []byte, err error) {
	if c > maxCode {
		return nil, nil, fmt.Errorf("status code %d is not a gRPC code", c)
	}
	meta := legacyAppendMetadata(legacyAppendMetadata(nil, envelopeMetaHeader, header), envelopeMetaTrailer, trailer)
	head := envelopeHeader
	if len(meta) > 0 {
		head += protowire.SizeVarint(uint64(len(meta))) + len(meta)
	}
	opts := proto.MarshalOptions{Deterministic: true}
	n := opts.Size(msg)
	opts.UseCachedSize = true
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
	binary.BigEndian.PutUint32(body[2:envelopeHeader], legacySum(body[1:2], body[envelopeHeader:]))
	return body, payload, nil
}

func legacyAppendMetadata(b []byte, num protowire.Number, md map[string][]string) []byte {
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

func legacyParseMetadata(b []byte) (header, trailer map[string][]string, err error) {
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
		md := &header
		if num == envelopeMetaTrailer {
			md = &trailer
		}
		if *md == nil {
			*md = map[string][]string{}
		}
		k := strings.ToLower(kv[0])
		(*md)[k] = append((*md)[k], kv[1])
	}
	return header, trailer, nil
}

// legacyOpen is openEnvelope for a row of code rowCode; enveloped reports
// a body marked 0x00 or 0x01.
func legacyOpen(rowCode code.Code, b []byte) (payload []byte, header, trailer map[string][]string, enveloped bool, err error) {
	if len(b) == 0 || (b[0] != envelopeMark && b[0] != envelopeMetaMark) {
		return b, nil, nil, false, nil
	}
	switch {
	case len(b) < envelopeHeader:
		return nil, nil, nil, true, errors.New("recorded outcome is shorter than its envelope")
	case code.Code(b[1]) != rowCode:
		return nil, nil, nil, true, fmt.Errorf("recorded outcome has code %d, its row %d", b[1], rowCode)
	case binary.BigEndian.Uint32(b[2:envelopeHeader]) != legacySum(b[1:2], b[envelopeHeader:]):
		return nil, nil, nil, true, errors.New("recorded outcome fails its checksum")
	}
	rest := b[envelopeHeader:]
	if b[0] == envelopeMetaMark {
		meta, n := protowire.ConsumeBytes(rest)
		if n < 0 {
			return nil, nil, nil, true, errors.New("recorded outcome's metadata is truncated")
		}
		if header, trailer, err = legacyParseMetadata(meta); err != nil {
			return nil, nil, nil, true, err
		}
		rest = rest[n:]
	}
	return rest, header, trailer, true, nil
}
