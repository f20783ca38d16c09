package fingerprint

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	idemv1 "github.com/idemkit/idem/gen/idem/v1"
)

// Version is the first byte of every fingerprint. It names the algorithm
// that produced the rest, so that fingerprints stored before a change to the
// algorithm can be told apart from fingerprints computed after it.
const Version byte = 1

// Size is the length of a fingerprint in bytes: Version followed by a
// SHA-256 digest.
const Size = 1 + sha256.Size

// maxPooledBuffer is the largest encoding buffer kept for reuse, so that one
// huge request does not pin its buffer for the life of the process.
const maxPooledBuffer = 64 << 10

var (
	errNilMessage = errors.New("fingerprint: nil message")

	// errWire reports an encoding that stripWire does not expect. It never
	// reaches the caller: Sum falls back to stripping a copy of the message.
	errWire = errors.New("fingerprint: unexpected encoding")

	marshalOptions = proto.MarshalOptions{Deterministic: true}
	// partialOptions encodes a stripped copy, whose required fields are
	// checked on the caller's message instead: the copy lacks the excluded
	// ones.
	partialOptions = proto.MarshalOptions{Deterministic: true, AllowPartial: true}

	scratchPool = sync.Pool{New: func() any {
		return &scratch{enc: make([]byte, 0, 1024)}
	}}

	defaultHasher = NewHasher()
)

// scratch holds the buffers of one Sum: enc for the encoding of the
// request, out for that encoding without the excluded fields.
type scratch struct {
	enc, out []byte
}

// release returns s to the pool, without a buffer grown so large that it
// would pin the memory of one huge request for the life of the process.
func (s *scratch) release() {
	if cap(s.enc) > maxPooledBuffer {
		s.enc = nil
	}
	if cap(s.out) > maxPooledBuffer {
		s.out = nil
	}
	scratchPool.Put(s)
}

// Hasher computes request fingerprints. It remembers, per message type,
// which fields are excluded and where they can occur, so reuse one Hasher
// for all requests. A Hasher is safe for concurrent use.
type Hasher struct {
	excluded map[protoreflect.FullName]struct{}
	plans    sync.Map // protoreflect.FullName of a message -> *plan
}

// NewHasher returns a Hasher configured by opts. Without options it
// excludes only the fields marked with
// [(idem.v1.field).fingerprint_exclude = true].
func NewHasher(opts ...Option) *Hasher {
	o := evaluateOptions(opts)
	return &Hasher{excluded: o.excluded}
}

// Sum returns the fingerprint of m computed by a Hasher without options:
// only fields marked with [(idem.v1.field).fingerprint_exclude = true] are
// excluded. See Hasher.Sum.
func Sum(m proto.Message) ([]byte, error) {
	return defaultHasher.Sum(m)
}

// Sum returns the fingerprint of m: Version followed by the SHA-256 digest of
// the deterministic encoding of m without its excluded fields, Size bytes in
// all. It does not modify m.
//
// Sum returns an error if m is nil or cannot be encoded, for example because
// a string field holds invalid UTF-8 or a required field is missing.
func (h *Hasher) Sum(m proto.Message) ([]byte, error) {
	if m == nil {
		return nil, errNilMessage
	}
	rm := m.ProtoReflect()
	if !rm.IsValid() {
		return nil, errNilMessage
	}

	s := scratchPool.Get().(*scratch)
	b, err := h.encode(m, rm, s)
	if err != nil {
		s.release()
		return nil, err
	}
	digest := sha256.Sum256(b)
	s.release()

	sum := make([]byte, Size)
	sum[0] = Version
	copy(sum[1:], digest[:])
	return sum, nil
}

// stripped returns the bytes whose digest is the fingerprint of m: its
// deterministic encoding without its excluded fields.
func (h *Hasher) stripped(m proto.Message) ([]byte, error) {
	if m == nil || !m.ProtoReflect().IsValid() {
		return nil, errNilMessage
	}
	s := scratchPool.Get().(*scratch)
	defer s.release()
	b, err := h.encode(m, m.ProtoReflect(), s)
	return bytes.Clone(b), err
}

// encode returns the deterministic encoding of m, whose reflection is rm,
// without its excluded fields. The result is in one of the buffers of s.
//
// It encodes m itself and then leaves the excluded fields out of the
// encoding (stripWire). Where that cannot be done, it encodes a stripped
// copy of m instead (encodeCopy), which gives the same bytes.
func (h *Hasher) encode(m proto.Message, rm protoreflect.Message, s *scratch) ([]byte, error) {
	p := h.plan(rm.Descriptor())
	if p.strip && !p.wire {
		return h.encodeCopy(m, rm, p, s)
	}
	b, err := marshalOptions.MarshalAppend(s.enc[:0], m)
	if err != nil {
		if p.strip {
			// The error may come from an excluded field, such as invalid
			// UTF-8 in it, which the stripped copy does not encode.
			return h.encodeCopy(m, rm, p, s)
		}
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	s.enc = b
	if !p.strip {
		return b, nil
	}
	// Without a field to strip before its unknown fields, the encoding is
	// already the result.
	off := p.firstOp(b)
	u := rm.GetUnknown()
	if known := len(b) - len(u); off >= known && known >= 0 && string(b[known:]) == string(u) {
		return b, nil
	}
	out, err := stripWire(s.out[:0], b, off, rm, p)
	if err != nil {
		return h.encodeCopy(m, rm, p, s)
	}
	s.out = out
	return out, nil
}

// encodeCopy returns the deterministic encoding of a copy of m, whose
// reflection is rm, without the excluded fields described by p. The result
// is in s.enc.
func (h *Hasher) encodeCopy(m proto.Message, rm protoreflect.Message, p *plan, s *scratch) ([]byte, error) {
	opts := marshalOptions
	if stripped, changed := h.strip(rm, p); changed {
		if err := proto.CheckInitialized(m); err != nil {
			return nil, fmt.Errorf("fingerprint: %w", err)
		}
		m, opts = stripped.Interface(), partialOptions
	}
	b, err := opts.MarshalAppend(s.enc[:0], m)
	if err != nil {
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	s.enc = b
	return b, nil
}

// plan says how to strip the excluded fields from one message type.
type plan struct {
	desc protoreflect.MessageDescriptor
	// strip reports whether a message of this type can hold an excluded
	// field, directly or at any depth. If not, it is encoded as it is.
	strip bool
	// excluded are the message's own excluded fields.
	excluded []protoreflect.FieldDescriptor
	// nested are the message, list and map fields whose messages can hold
	// excluded fields.
	nested []nestedField
	// extendable reports whether the message has extension ranges. Its
	// extensions are only known at run time, so they are inspected then.
	extendable bool
	// wire reports whether stripWire can leave the excluded fields out of
	// the encoding of the message. It cannot when the message, or one it
	// can hold an excluded field in, is extendable, or when such a message
	// is encoded as a group; then a stripped copy is encoded instead.
	wire bool
	// ops are the fields stripWire acts on, excluded and nested ones,
	// sorted by number.
	ops []fieldOp
}

type nestedField struct {
	fd   protoreflect.FieldDescriptor
	plan *plan
}

// fieldOp is what stripWire does with one field of the encoding.
type fieldOp struct {
	num protowire.Number
	// nested is nil for an excluded field, which is dropped. Otherwise it
	// is a field whose messages are stripped in turn.
	nested *nestedField
	// typ is the wire type of the field, and packed reports whether it may
	// also be encoded as a packed list.
	typ    protowire.Type
	packed bool
}

// firstOp returns the offset in src, the encoding of a message of plan p,
// of the first field that stripWire acts on or cannot parse, or len(src).
func (p *plan) firstOp(src []byte) int {
	for i := 0; i < len(src); {
		num, typ, n := protowire.ConsumeTag(src[i:])
		if n < 0 || p.op(num) != nil {
			return i
		}
		m := protowire.ConsumeFieldValue(num, typ, src[i+n:])
		if m < 0 {
			return i
		}
		i += n + m
	}
	return len(src)
}

// op returns the operation on field num, or nil if the field is copied.
func (p *plan) op(num protowire.Number) *fieldOp {
	if len(p.ops) <= 8 {
		for i := range p.ops {
			if p.ops[i].num == num {
				return &p.ops[i]
			}
		}
		return nil
	}
	i, ok := slices.BinarySearchFunc(p.ops, num, func(o fieldOp, num protowire.Number) int {
		return cmp.Compare(o.num, num)
	})
	if !ok {
		return nil
	}
	return &p.ops[i]
}

// plan returns the plan for md, building and caching it on first use.
func (h *Hasher) plan(md protoreflect.MessageDescriptor) *plan {
	if v, ok := h.plans.Load(md.FullName()); ok {
		// A different descriptor of the same name (a dynamic message built
		// from another version of the schema) gets a plan of its own.
		if p := v.(*plan); p.desc == md {
			return p
		}
	}
	return h.build(md)
}

// build makes the plans of root and of every message type reachable from
// it that has none yet, and caches them. Types can be recursive, so it
// first records each type's own excluded fields and then propagates strip
// along the fields until nothing changes.
func (h *Hasher) build(root protoreflect.MessageDescriptor) *plan {
	plans := make(map[protoreflect.MessageDescriptor]*plan)
	var fresh []*plan
	var visit func(md protoreflect.MessageDescriptor) *plan
	visit = func(md protoreflect.MessageDescriptor) *plan {
		if p, ok := plans[md]; ok {
			return p
		}
		if v, ok := h.plans.Load(md.FullName()); ok && v.(*plan).desc == md {
			plans[md] = v.(*plan)
			return v.(*plan)
		}
		p := &plan{desc: md, extendable: md.ExtensionRanges().Len() > 0}
		p.strip = p.extendable
		plans[md] = p
		fresh = append(fresh, p)
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if h.excludes(fd) {
				p.excluded = append(p.excluded, fd)
				p.strip = true
				continue
			}
			if child := elemMessage(fd); child != nil {
				p.nested = append(p.nested, nestedField{fd: fd, plan: visit(child)})
			}
		}
		return p
	}
	rootPlan := visit(root)

	for changed := true; changed; {
		changed = false
		for _, p := range fresh {
			if p.strip {
				continue
			}
			for _, n := range p.nested {
				if n.plan.strip {
					p.strip, changed = true, true
					break
				}
			}
		}
	}
	for _, p := range fresh {
		p.nested = slices.Clip(slices.DeleteFunc(p.nested, func(n nestedField) bool {
			return !n.plan.strip
		}))
	}

	// A message can be stripped on the wire if it is not extendable and
	// each message it can hold an excluded field in is length-delimited and
	// can be stripped on the wire too.
	for _, p := range fresh {
		p.wire = p.strip && !p.extendable
		for _, n := range p.nested {
			if elemKind(n.fd) == protoreflect.GroupKind {
				p.wire = false
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for _, p := range fresh {
			if !p.wire {
				continue
			}
			for _, n := range p.nested {
				if !n.plan.wire {
					p.wire, changed = false, true
					break
				}
			}
		}
	}
	for _, p := range fresh {
		if !p.wire {
			continue
		}
		for _, fd := range p.excluded {
			p.ops = append(p.ops, newFieldOp(fd, nil))
		}
		for i := range p.nested {
			p.ops = append(p.ops, newFieldOp(p.nested[i].fd, &p.nested[i]))
		}
		slices.SortFunc(p.ops, func(a, b fieldOp) int { return cmp.Compare(a.num, b.num) })
	}
	for _, p := range fresh {
		// Plans are complete before they are shared. If another goroutine
		// cached a plan for the same type first, keep its plan: both are
		// equal.
		h.plans.LoadOrStore(p.desc.FullName(), p)
	}
	return rootPlan
}

// excludes reports whether fd is left out of the fingerprint.
func (h *Hasher) excludes(fd protoreflect.FieldDescriptor) bool {
	if _, ok := h.excluded[fd.FullName()]; ok {
		return true
	}
	policy, _ := proto.GetExtension(fd.Options(), idemv1.E_Field).(*idemv1.FieldPolicy)
	// A field that carries the call's idempotency key is not part of the
	// request the key names.
	return policy.GetFingerprintExclude() || policy.GetKey()
}

// elemKind returns the kind of fd, of its list elements or of its map
// values.
func elemKind(fd protoreflect.FieldDescriptor) protoreflect.Kind {
	if fd.IsMap() {
		return fd.MapValue().Kind()
	}
	return fd.Kind()
}

func newFieldOp(fd protoreflect.FieldDescriptor, nested *nestedField) fieldOp {
	op := fieldOp{num: fd.Number(), nested: nested, typ: wireType(fd.Kind())}
	if fd.IsMap() {
		op.typ = protowire.BytesType
	} else if fd.IsList() && op.typ != protowire.BytesType && op.typ != protowire.StartGroupType {
		op.packed = true
	}
	return op
}

// wireType returns the wire type of a value of kind k.
func wireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind,
		protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Uint32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	default: // string, bytes, message
		return protowire.BytesType
	}
}

// elemMessage returns the message type held by fd, its list elements or its
// map values, or nil if fd holds no messages.
func elemMessage(fd protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if fd.IsMap() {
		return fd.MapValue().Message()
	}
	return fd.Message()
}

// edit replaces the value of one field in a stripped copy.
type edit struct {
	fd protoreflect.FieldDescriptor
	v  protoreflect.Value
}

// strip returns m without the excluded fields described by p. If no
// excluded field is set anywhere in m, it returns m itself and false.
// Otherwise it returns a new message and true; the new message shares every
// field that needs no change with m, and m is not modified.
func (h *Hasher) strip(m protoreflect.Message, p *plan) (protoreflect.Message, bool) {
	dirty := false
	for _, fd := range p.excluded {
		if m.Has(fd) {
			dirty = true
			break
		}
	}
	var edits []edit
	for _, n := range p.nested {
		if !m.Has(n.fd) {
			continue
		}
		if v, changed := h.stripValue(m, n.fd, m.Get(n.fd), n.plan); changed {
			edits = append(edits, edit{fd: n.fd, v: v})
		}
	}
	if p.extendable {
		var excluded bool
		edits, excluded = h.stripExtensions(m, edits)
		dirty = dirty || excluded
	}
	if !dirty && len(edits) == 0 {
		return m, false
	}
	return h.copyMessage(m, p, edits), true
}

// stripExtensions appends to edits the changes to the extension fields of
// m, and reports whether any of them is excluded.
func (h *Hasher) stripExtensions(m protoreflect.Message, edits []edit) ([]edit, bool) {
	excluded := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if !fd.IsExtension() {
			return true
		}
		if h.excludes(fd) {
			excluded = true
			return true
		}
		if md := elemMessage(fd); md != nil {
			if p := h.plan(md); p.strip {
				if v, changed := h.stripValue(m, fd, v, p); changed {
					edits = append(edits, edit{fd: fd, v: v})
				}
			}
		}
		return true
	})
	return edits, excluded
}

// copyMessage returns a new message with the fields and unknown fields of
// m, except the excluded ones, and with edits applied.
func (h *Hasher) copyMessage(m protoreflect.Message, p *plan, edits []edit) protoreflect.Message {
	c := m.New()
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if slices.Contains(p.excluded, fd) || fd.IsExtension() && h.excludes(fd) {
			return true
		}
		c.Set(fd, v) // may share v with m; edited fields are replaced below
		return true
	})
	for _, e := range edits {
		c.Set(e.fd, e.v)
	}
	if u := m.GetUnknown(); len(u) > 0 {
		c.SetUnknown(u)
	}
	return c
}

type mapEntry struct {
	k protoreflect.MapKey
	v protoreflect.Value
}

// stripValue strips the messages in v, the value of field fd of m, as
// described by p. It returns a new value and true if any of them changed,
// and v and false otherwise.
func (h *Hasher) stripValue(m protoreflect.Message, fd protoreflect.FieldDescriptor, v protoreflect.Value, p *plan) (protoreflect.Value, bool) {
	switch {
	case fd.IsList():
		src := v.List()
		var dst protoreflect.List
		for i := range src.Len() {
			e, changed := h.strip(src.Get(i).Message(), p)
			if changed && dst == nil {
				dst = m.NewField(fd).List()
				for j := range i {
					dst.Append(src.Get(j))
				}
			}
			if dst != nil {
				dst.Append(protoreflect.ValueOfMessage(e))
			}
		}
		if dst == nil {
			return v, false
		}
		return protoreflect.ValueOfList(dst), true

	case fd.IsMap():
		src := v.Map()
		var changed []mapEntry
		src.Range(func(k protoreflect.MapKey, e protoreflect.Value) bool {
			if s, ok := h.strip(e.Message(), p); ok {
				changed = append(changed, mapEntry{k: k, v: protoreflect.ValueOfMessage(s)})
			}
			return true
		})
		if len(changed) == 0 {
			return v, false
		}
		dst := m.NewField(fd).Map()
		src.Range(func(k protoreflect.MapKey, e protoreflect.Value) bool {
			dst.Set(k, e)
			return true
		})
		for _, e := range changed {
			dst.Set(e.k, e.v)
		}
		return protoreflect.ValueOfMap(dst), true

	default:
		s, changed := h.strip(v.Message(), p)
		return protoreflect.ValueOfMessage(s), changed
	}
}

// stripWire appends to dst src, the deterministic encoding of m, a message
// of plan p, without its excluded fields. src[:off] holds no field that p
// acts on.
//
// Deterministic encoding writes each known field on its own, in an order
// fixed by the message type, and then the unknown fields as they are.
// Dropping the bytes of an excluded field therefore gives the encoding of
// the message without it, and a nested message stripped in turn and
// prefixed with its new length gives the encoding of the parent holding the
// stripped nested message. Unknown fields are never excluded: they are
// copied, even where they reuse the number of an excluded field.
//
// The messages that are stripped in turn are looked up in m only when
// their encoding holds a field that their plan acts on, for their unknown
// fields.
//
// stripWire returns errWire for an encoding it does not expect.
func stripWire(dst, src []byte, off int, m protoreflect.Message, p *plan) ([]byte, error) {
	u := m.GetUnknown()
	known := len(src) - len(u)
	if known < 0 || string(src[known:]) != string(u) {
		return dst, errWire
	}
	if off >= known {
		return append(dst, src...), nil
	}
	dst = append(dst, src[:off]...)

	var (
		run   = off // start of the bytes not yet copied to dst
		cur   *nestedField
		list  protoreflect.List
		mapv  protoreflect.Map
		index int // of the next element of cur
	)
	for i := off; i < known; {
		num, typ, n := protowire.ConsumeTag(src[i:known])
		if n < 0 {
			return dst, errWire
		}
		v := protowire.ConsumeFieldValue(num, typ, src[i+n:known])
		if v < 0 {
			return dst, errWire
		}
		end := i + n + v
		op := p.op(num)
		if op == nil {
			i = end
			continue
		}
		if typ != op.typ && (!op.packed || typ != protowire.BytesType) {
			return dst, errWire
		}
		dst = append(dst, src[run:i]...)
		run = end
		nf := op.nested
		if nf == nil { // excluded
			i = end
			continue
		}

		// The elements of a list or a map are encoded one after another.
		if nf != cur {
			cur, list, mapv, index = nf, nil, nil, 0
		}
		payload, _ := protowire.ConsumeBytes(src[i+n : end])
		dst = append(dst, src[i:i+n]...)
		var err error
		switch {
		case nf.fd.IsMap():
			dst, err = stripEntry(dst, payload, m, nf, &mapv)
		case nf.fd.IsList():
			k := nf.plan.firstOp(payload)
			if k == len(payload) {
				dst = protowire.AppendBytes(dst, payload)
				break
			}
			if list == nil {
				list = m.Get(nf.fd).List()
			}
			if index >= list.Len() {
				return dst, errWire
			}
			dst, err = appendNested(dst, payload, k, list.Get(index).Message(), nf.plan)
		default:
			k := nf.plan.firstOp(payload)
			if k == len(payload) {
				dst = protowire.AppendBytes(dst, payload)
				break
			}
			dst, err = appendNested(dst, payload, k, m.Get(nf.fd).Message(), nf.plan)
		}
		if err != nil {
			return dst, err
		}
		index++
		i = end
	}
	return append(dst, src[run:]...), nil
}

// stripEntry appends to dst the length-prefixed entry of the map field nf
// of m, without the excluded fields of its value. mapv caches the map.
func stripEntry(dst, entry []byte, m protoreflect.Message, nf *nestedField, mapv *protoreflect.Map) ([]byte, error) {
	// An entry holds the key, field 1, and the value, field 2.
	var value []byte
	valueTag, valueEnd := -1, 0
	for i := 0; i < len(entry); {
		num, typ, n := protowire.ConsumeTag(entry[i:])
		if n < 0 {
			return dst, errWire
		}
		v := protowire.ConsumeFieldValue(num, typ, entry[i+n:])
		if v < 0 {
			return dst, errWire
		}
		if num == 2 {
			if typ != protowire.BytesType || valueTag >= 0 {
				return dst, errWire
			}
			value, _ = protowire.ConsumeBytes(entry[i+n:])
			valueTag, valueEnd = i+n, i+n+v
		}
		i += n + v
	}
	k := nf.plan.firstOp(value)
	if k == len(value) {
		return protowire.AppendBytes(dst, entry), nil
	}

	key, err := entryKey(entry, nf.fd.MapKey())
	if err != nil {
		return dst, err
	}
	if *mapv == nil {
		*mapv = m.Get(nf.fd).Map()
	}
	val := (*mapv).Get(key)
	if !val.IsValid() {
		return dst, errWire
	}

	dst, start := beginLen(dst, len(entry))
	dst = append(dst, entry[:valueTag]...)
	dst, err = appendNested(dst, value, k, val.Message(), nf.plan)
	if err != nil {
		return dst, err
	}
	dst = append(dst, entry[valueEnd:]...)
	return endLen(dst, start, len(entry))
}

// entryKey returns the key of the map entry encoded in entry, whose key
// field is kd.
func entryKey(entry []byte, kd protoreflect.FieldDescriptor) (protoreflect.MapKey, error) {
	key := kd.Default()
	for i := 0; i < len(entry); {
		num, typ, n := protowire.ConsumeTag(entry[i:])
		if n < 0 {
			return protoreflect.MapKey{}, errWire
		}
		b := entry[i+n:]
		v := protowire.ConsumeFieldValue(num, typ, b)
		if v < 0 {
			return protoreflect.MapKey{}, errWire
		}
		i += n + v
		if num != 1 {
			continue
		}
		if typ != wireType(kd.Kind()) {
			return protoreflect.MapKey{}, errWire
		}
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, _ = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			y, _ := protowire.ConsumeFixed32(b)
			x = uint64(y)
		case protowire.Fixed64Type:
			x, _ = protowire.ConsumeFixed64(b)
		}
		switch kd.Kind() {
		case protoreflect.BoolKind:
			key = protoreflect.ValueOfBool(protowire.DecodeBool(x))
		case protoreflect.Int32Kind, protoreflect.Sfixed32Kind:
			key = protoreflect.ValueOfInt32(int32(x))
		case protoreflect.Sint32Kind:
			key = protoreflect.ValueOfInt32(int32(protowire.DecodeZigZag(x & math.MaxUint32)))
		case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
			key = protoreflect.ValueOfUint32(uint32(x))
		case protoreflect.Int64Kind, protoreflect.Sfixed64Kind:
			key = protoreflect.ValueOfInt64(int64(x))
		case protoreflect.Sint64Kind:
			key = protoreflect.ValueOfInt64(protowire.DecodeZigZag(x))
		case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
			key = protoreflect.ValueOfUint64(x)
		case protoreflect.StringKind:
			s, _ := protowire.ConsumeBytes(b)
			key = protoreflect.ValueOfString(string(s))
		default:
			return protoreflect.MapKey{}, errWire
		}
	}
	return key.MapKey(), nil
}

// appendNested appends to dst the length-prefixed encoding src of m, a
// message of plan p, without its excluded fields. src[:off] holds no field
// that p acts on.
func appendNested(dst, src []byte, off int, m protoreflect.Message, p *plan) ([]byte, error) {
	dst, start := beginLen(dst, len(src))
	dst, err := stripWire(dst, src, off, m, p)
	if err != nil {
		return dst, err
	}
	return endLen(dst, start, len(src))
}

// beginLen reserves room at the end of dst for the length of a payload of
// at most max bytes, and returns the offset where the payload starts.
func beginLen(dst []byte, max int) ([]byte, int) {
	dst = append(dst, make([]byte, protowire.SizeVarint(uint64(max)))...)
	return dst, len(dst)
}

// endLen writes the length of the payload dst[start:] in the room reserved
// for it by beginLen(dst, max), moving the payload back if its length takes
// fewer bytes.
func endLen(dst []byte, start, max int) ([]byte, error) {
	n := len(dst) - start
	if n > max {
		return dst, errWire
	}
	room := protowire.SizeVarint(uint64(max))
	pos := start - room
	if size := protowire.SizeVarint(uint64(n)); size < room {
		copy(dst[pos+size:], dst[start:])
		dst = dst[:len(dst)-(room-size)]
	}
	protowire.AppendVarint(dst[:pos], uint64(n))
	return dst, nil
}
