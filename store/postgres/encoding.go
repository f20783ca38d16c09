package postgres

import (
	"errors"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/idemkit/idem/store"
)

// The lists idem keeps in bytea columns are protobuf encodings, read and
// written with protowire: a repeated entry (field 1) of a name (1) and a
// value (2). recovery_steps holds a key's steps in order, and
// request_metadata a call's metadata, one entry per value, names sorted.

// appendEntry appends one entry of name and value to b.
func appendEntry(b []byte, name string, value []byte) []byte {
	var e []byte
	e = protowire.AppendTag(e, 1, protowire.BytesType)
	e = protowire.AppendString(e, name)
	e = protowire.AppendTag(e, 2, protowire.BytesType)
	e = protowire.AppendBytes(e, value)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendBytes(b, e)
}

// rangeEntries calls f with each entry of b, in order.
func rangeEntries(b []byte, f func(name string, value []byte)) error {
	errMalformed := errors.New("postgres: a list kept in idempotency_keys is malformed")
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return errMalformed
		}
		e, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return errMalformed
		}
		b = b[n+m:]
		var fields [2][]byte
		for i := range fields {
			num, typ, n := protowire.ConsumeTag(e)
			if n < 0 || num != protowire.Number(i+1) || typ != protowire.BytesType {
				return errMalformed
			}
			v, m := protowire.ConsumeBytes(e[n:])
			if m < 0 {
				return errMalformed
			}
			fields[i], e = v, e[n+m:]
		}
		f(string(fields[0]), fields[1])
	}
	return nil
}

func encodeSteps(steps []store.RecoveryPoint) []byte {
	var b []byte
	for _, p := range steps {
		b = appendEntry(b, p.Step, p.Data)
	}
	return b
}

func decodeSteps(b []byte) ([]store.RecoveryPoint, error) {
	var steps []store.RecoveryPoint
	err := rangeEntries(b, func(name string, value []byte) {
		steps = append(steps, store.RecoveryPoint{Step: name, Data: slices.Clone(value)})
	})
	return steps, err
}

func encodeMetadata(md map[string][]string) []byte {
	names := make([]string, 0, len(md))
	for k := range md {
		names = append(names, k)
	}
	slices.Sort(names)
	var b []byte
	for _, k := range names {
		for _, v := range md[k] {
			b = appendEntry(b, k, []byte(v))
		}
	}
	return b
}

func decodeMetadata(b []byte) (map[string][]string, error) {
	md := map[string][]string{}
	err := rangeEntries(b, func(name string, value []byte) {
		md[name] = append(md[name], string(value))
	})
	return md, err
}
