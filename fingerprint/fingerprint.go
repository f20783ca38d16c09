package fingerprint

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"

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

	marshalOptions = proto.MarshalOptions{Deterministic: true}
	// partialOptions encodes a stripped copy, whose required fields are
	// checked on the caller's message instead: the copy lacks the excluded
	// ones.
	partialOptions = proto.MarshalOptions{Deterministic: true, AllowPartial: true}

	bufferPool = sync.Pool{New: func() any {
		b := make([]byte, 0, 1024)
		return &b
	}}

	defaultHasher = NewHasher()
)

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

	opts := marshalOptions
	if p := h.plan(rm.Descriptor()); p.strip {
		if stripped, changed := h.strip(rm, p); changed {
			if err := proto.CheckInitialized(m); err != nil {
				return nil, fmt.Errorf("fingerprint: %w", err)
			}
			m, opts = stripped.Interface(), partialOptions
		}
	}

	buf := bufferPool.Get().(*[]byte)
	b, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		putBuffer(buf, b)
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	digest := sha256.Sum256(b)
	putBuffer(buf, b)

	sum := make([]byte, Size)
	sum[0] = Version
	copy(sum[1:], digest[:])
	return sum, nil
}

func putBuffer(buf *[]byte, b []byte) {
	if cap(b) > maxPooledBuffer {
		return
	}
	*buf = b[:0]
	bufferPool.Put(buf)
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
}

type nestedField struct {
	fd   protoreflect.FieldDescriptor
	plan *plan
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
	return policy.GetFingerprintExclude()
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
