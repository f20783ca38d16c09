package fingerprint_test

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/fingerprint"
	idemv1 "github.com/idemkit/idem/gen/idem/v1"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// referenceStripped is the definition of the bytes a fingerprint hashes:
// the deterministic encoding of a clone of m whose excluded fields are
// cleared at every depth.
func referenceStripped(t *testing.T, m proto.Message, names []protoreflect.FullName) []byte {
	t.Helper()
	c := proto.Clone(m)
	clearExcluded(c.ProtoReflect(), names)
	b, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(c)
	if err != nil {
		t.Fatalf("reference encoding of %v: %v", describe(m), err)
	}
	return b
}

func isExcluded(fd protoreflect.FieldDescriptor, names []protoreflect.FullName) bool {
	if slices.Contains(names, fd.FullName()) {
		return true
	}
	policy, _ := proto.GetExtension(fd.Options(), idemv1.E_Field).(*idemv1.FieldPolicy)
	return policy.GetFingerprintExclude() || policy.GetKey()
}

func clearExcluded(m protoreflect.Message, names []protoreflect.FullName) {
	var fields []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		fields = append(fields, fd)
		return true
	})
	for _, fd := range fields {
		switch {
		case isExcluded(fd, names):
			m.Clear(fd)
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				m.Mutable(fd).Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
					clearExcluded(v.Message(), names)
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				l := m.Mutable(fd).List()
				for i := range l.Len() {
					clearExcluded(l.Get(i).Message(), names)
				}
			}
		case fd.Message() != nil:
			clearExcluded(m.Mutable(fd).Message(), names)
		}
	}
}

// filler sets random fields of messages.
type filler struct {
	r *rand.Rand
	// extensions are set like fields, by extended message.
	extensions map[protoreflect.FullName][]protoreflect.ExtensionType
	// pMessage is the probability that a field holding messages is set.
	pMessage float64
}

// fill sets random fields of m, and of the messages in them down to depth.
// If group, m is encoded as a group, whose end its unknown fields must not
// hide: they are well-formed.
func (f *filler) fill(m protoreflect.Message, depth int, group bool) {
	md := m.Descriptor()
	// One arm of each oneof may be set.
	arms := make(map[protoreflect.OneofDescriptor]protoreflect.FieldDescriptor)
	for i := range md.Oneofs().Len() {
		if od := md.Oneofs().Get(i); !od.IsSynthetic() {
			arms[od] = od.Fields().Get(f.r.IntN(od.Fields().Len()))
		}
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && arms[od] != fd {
			continue
		}
		f.maybeSet(m, fd, depth)
	}
	for _, xt := range f.extensions[md.FullName()] {
		f.maybeSet(m, xt.TypeDescriptor(), depth)
	}
	if f.r.IntN(4) == 0 {
		m.SetUnknown(f.unknown(md, group))
	}
}

func (f *filler) maybeSet(m protoreflect.Message, fd protoreflect.FieldDescriptor, depth int) {
	holdsMessages := fd.Message() != nil || fd.IsMap() && fd.MapValue().Message() != nil
	switch {
	case fd.Cardinality() == protoreflect.Required:
	case holdsMessages && (depth <= 0 || f.r.Float64() >= f.pMessage):
		return
	case !holdsMessages && f.r.IntN(2) == 0:
		return
	}
	switch {
	case fd.IsMap():
		mv := m.Mutable(fd).Map()
		for range 1 + f.r.IntN(3) {
			k := f.scalar(fd.MapKey()).MapKey()
			if fd.MapValue().Message() != nil {
				v := mv.NewValue()
				f.fill(v.Message(), depth-1, false)
				mv.Set(k, v)
			} else {
				mv.Set(k, f.scalar(fd.MapValue()))
			}
		}
	case fd.IsList():
		l := m.Mutable(fd).List()
		for range 1 + f.r.IntN(3) {
			if fd.Message() != nil {
				v := l.NewElement()
				f.fill(v.Message(), depth-1, fd.Kind() == protoreflect.GroupKind)
				l.Append(v)
			} else {
				l.Append(f.scalar(fd))
			}
		}
	case fd.Message() != nil:
		v := m.NewField(fd)
		f.fill(v.Message(), depth-1, fd.Kind() == protoreflect.GroupKind)
		m.Set(fd, v)
	default:
		m.Set(fd, f.scalar(fd))
	}
}

func (f *filler) scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	r := f.r
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(r.IntN(2) == 0)
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		return protoreflect.ValueOfEnum(values.Get(r.IntN(values.Len())).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(r.Uint32()) >> r.IntN(32))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(r.Uint32() >> r.IntN(32))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(r.Uint64()) >> r.IntN(64))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(r.Uint64() >> r.IntN(64))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(r.NormFloat64()))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(r.NormFloat64())
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(f.text())
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(f.text()))
	}
	panic("no scalar of kind " + fd.Kind().String())
}

// text returns a short string, or sometimes one long enough that leaving
// it out changes the size of the enclosing lengths.
func (f *filler) text() string {
	n := f.r.IntN(6)
	if f.r.IntN(8) == 0 {
		n = 100 + f.r.IntN(100)
	}
	var b strings.Builder
	for range n {
		b.WriteRune([]rune("abxyz-é")[f.r.IntN(7)])
	}
	return b.String()
}

// unknown returns unknown fields for a message of type md. They reuse the
// numbers of md's fields, excluded or not, with any wire type, or are
// malformed.
func (f *filler) unknown(md protoreflect.MessageDescriptor, wellFormed bool) []byte {
	var b []byte
	for range 1 + f.r.IntN(3) {
		num := protowire.Number(1000 + f.r.IntN(5))
		if fields := md.Fields(); fields.Len() > 0 && f.r.IntN(3) > 0 {
			num = fields.Get(f.r.IntN(fields.Len())).Number()
		}
		switch f.r.IntN(6 - boolInt(wellFormed)) {
		case 0:
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, f.r.Uint64()>>f.r.IntN(64))
		case 1:
			b = protowire.AppendTag(b, num, protowire.Fixed32Type)
			b = protowire.AppendFixed32(b, f.r.Uint32())
		case 2:
			b = protowire.AppendTag(b, num, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, f.r.Uint64())
		case 3:
			// Bytes that parse as a message setting fields 1 to 3.
			var p []byte
			for n := range protowire.Number(3) {
				p = protowire.AppendTag(p, n+1, protowire.BytesType)
				p = protowire.AppendString(p, f.text())
			}
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, p)
		case 4:
			b = protowire.AppendTag(b, num, protowire.StartGroupType)
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendString(b, f.text())
			b = protowire.AppendTag(b, num, protowire.EndGroupType)
		case 5:
			if f.r.IntN(2) == 0 {
				return append(b, 0xff) // a truncated tag
			}
			return append(b, 0) // field number 0
		}
	}
	return b
}

// descriptor building helpers.

type (
	fieldProto = descriptorpb.FieldDescriptorProto
	msgProto   = descriptorpb.DescriptorProto
)

var (
	optional = descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	repeated = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	required = descriptorpb.FieldDescriptorProto_LABEL_REQUIRED.Enum()
)

func field(name string, num int32, label *descriptorpb.FieldDescriptorProto_Label, typ descriptorpb.FieldDescriptorProto_Type, typeName string) *fieldProto {
	f := &fieldProto{Name: proto.String(name), Number: proto.Int32(num), Label: label, Type: typ.Enum()}
	if typeName != "" {
		f.TypeName = proto.String(typeName)
	}
	return f
}

func excludedField(f *fieldProto) *fieldProto {
	f.Options = excludedOption()
	return f
}

func inOneof(f *fieldProto, index int32) *fieldProto {
	f.OneofIndex = proto.Int32(index)
	return f
}

// addMap adds to m, whose full name is scope, the map field name, with its
// entry type.
func addMap(m *msgProto, scope, name string, num int32, key, value descriptorpb.FieldDescriptorProto_Type, valueType string) *fieldProto {
	var entry strings.Builder
	for part := range strings.SplitSeq(name, "_") {
		r := []rune(part)
		entry.WriteRune(unicode.ToUpper(r[0]))
		entry.WriteString(string(r[1:]))
	}
	entry.WriteString("Entry")
	m.NestedType = append(m.NestedType, &msgProto{
		Name:    proto.String(entry.String()),
		Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
		Field: []*fieldProto{
			field("key", 1, optional, key, ""),
			field("value", 2, optional, value, valueType),
		},
	})
	f := field(name, num, repeated, descriptorpb.FieldDescriptorProto_TYPE_MESSAGE, scope+"."+entry.String())
	m.Field = append(m.Field, f)
	return f
}

// nodeFile declares, in proto3, a recursive message with maps of every key
// type, lists, oneofs and excluded fields of many kinds:
//
//	message Node {
//	  string name = 1;
//	  string secret = 2 [(idem.v1.field).fingerprint_exclude = true];
//	  repeated Node children = 3;
//	  map<int32, Node> by_int32 = 4; ... (a map for each key type)
//	  oneof pick { Node node = 9; string text = 10; Node secret_node = 26 [excluded]; }
//	  ...
//	}
func nodeFile(t *testing.T) protoreflect.FileDescriptor {
	const (
		str  = descriptorpb.FieldDescriptorProto_TYPE_STRING
		msg  = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
		node = ".fptest.Node"
		leaf = ".fptest.Leaf"
	)
	n := &msgProto{
		Name:      proto.String("Node"),
		OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: proto.String("pick")}},
		Field: []*fieldProto{
			field("name", 1, optional, str, ""),
			excludedField(field("secret", 2, optional, str, "")),
			field("children", 3, repeated, msg, node),
			inOneof(field("node", 9, optional, msg, node), 0),
			inOneof(field("text", 10, optional, str, ""), 0),
			excludedField(inOneof(field("secret_node", 26, optional, msg, node), 0)),
			excludedField(field("numbers", 11, repeated, descriptorpb.FieldDescriptorProto_TYPE_INT64, "")),
			field("single", 19, optional, msg, node),
			excludedField(field("blob", 20, optional, descriptorpb.FieldDescriptorProto_TYPE_BYTES, "")),
			excludedField(field("hidden", 21, repeated, str, "")),
			field("leaf", 23, optional, msg, leaf),
			field("color", 24, optional, descriptorpb.FieldDescriptorProto_TYPE_ENUM, ".fptest.Color"),
			excludedField(field("hidden_node", 25, optional, msg, node)),
			field("far", 200, optional, msg, node),
			field("sint", 201, optional, descriptorpb.FieldDescriptorProto_TYPE_SINT64, ""),
		},
	}
	for _, m := range []struct {
		name string
		num  int32
		key  descriptorpb.FieldDescriptorProto_Type
	}{
		{"by_int32", 4, descriptorpb.FieldDescriptorProto_TYPE_INT32},
		{"by_sint64", 5, descriptorpb.FieldDescriptorProto_TYPE_SINT64},
		{"by_bool", 6, descriptorpb.FieldDescriptorProto_TYPE_BOOL},
		{"by_fixed32", 7, descriptorpb.FieldDescriptorProto_TYPE_FIXED32},
		{"by_string", 8, descriptorpb.FieldDescriptorProto_TYPE_STRING},
		{"by_sfixed64", 12, descriptorpb.FieldDescriptorProto_TYPE_SFIXED64},
		{"by_uint64", 13, descriptorpb.FieldDescriptorProto_TYPE_UINT64},
		{"by_sint32", 14, descriptorpb.FieldDescriptorProto_TYPE_SINT32},
		{"by_uint32", 15, descriptorpb.FieldDescriptorProto_TYPE_UINT32},
		{"by_fixed64", 16, descriptorpb.FieldDescriptorProto_TYPE_FIXED64},
		{"by_sfixed32", 17, descriptorpb.FieldDescriptorProto_TYPE_SFIXED32},
		{"by_int64", 18, descriptorpb.FieldDescriptorProto_TYPE_INT64},
	} {
		addMap(n, node, m.name, m.num, m.key, msg, node)
	}
	excludedField(addMap(n, node, "labels", 22, str, str, ""))
	addMap(n, node, "leaves", 27, str, msg, leaf)

	return newFile(t, &descriptorpb.FileDescriptorProto{
		Name:    proto.String("fingerprint/strip_node.proto"),
		Package: proto.String("fptest"),
		Syntax:  proto.String("proto3"),
		EnumType: []*descriptorpb.EnumDescriptorProto{{
			Name: proto.String("Color"),
			Value: []*descriptorpb.EnumValueDescriptorProto{
				{Name: proto.String("ZERO"), Number: proto.Int32(0)},
				{Name: proto.String("ONE"), Number: proto.Int32(1)},
				{Name: proto.String("TWO"), Number: proto.Int32(2)},
			},
		}},
		MessageType: []*msgProto{n, {
			Name: proto.String("Leaf"),
			Field: []*fieldProto{
				field("a", 1, optional, str, ""),
				field("more", 2, repeated, msg, leaf),
			},
		}},
	})
}

// proto2File declares proto2 messages with required and group fields, a
// closed enum and extensions:
//
//	message Req2 {
//	  required string id = 1 [excluded];
//	  optional string value = 2;
//	  optional Color2 color = 3 [excluded];
//	  repeated Req2 more = 4;
//	  map<string, Req2> by_key = 5;
//	  optional group Grp = 6 { optional string keep = 1; }
//	  repeated sint32 packed_nums = 7 [packed = true, excluded];
//	  repeated fixed32 nums = 8 [excluded];
//	  optional group Drop = 9 [excluded] { optional string keep = 1; }
//	  optional Color2 kept_color = 10;
//	}
//	message Ext2 {
//	  optional string value = 1;
//	  optional group Sg = 2 { optional string secret = 1 [excluded]; optional string keep = 2; }
//	  repeated Req2 reqs = 3;
//	  extensions 100 to 200;
//	}
//	extend Ext2 {
//	  optional string trace = 100 [excluded];
//	  optional Req2 req = 101;
//	}
func proto2File(t *testing.T) protoreflect.FileDescriptor {
	const (
		str   = descriptorpb.FieldDescriptorProto_TYPE_STRING
		msg   = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
		group = descriptorpb.FieldDescriptorProto_TYPE_GROUP
		enum  = descriptorpb.FieldDescriptorProto_TYPE_ENUM
	)
	packed := field("packed_nums", 7, repeated, descriptorpb.FieldDescriptorProto_TYPE_SINT32, "")
	packed.Options = excludedOption()
	packed.Options.Packed = proto.Bool(true)
	req := &msgProto{
		Name: proto.String("Req2"),
		Field: []*fieldProto{
			excludedField(field("id", 1, required, str, "")),
			field("value", 2, optional, str, ""),
			excludedField(field("color", 3, optional, enum, ".fptest2.Color2")),
			field("more", 4, repeated, msg, ".fptest2.Req2"),
			field("grp", 6, optional, group, ".fptest2.Req2.Grp"),
			packed,
			excludedField(field("nums", 8, repeated, descriptorpb.FieldDescriptorProto_TYPE_FIXED32, "")),
			excludedField(field("drop", 9, optional, group, ".fptest2.Req2.Drop")),
			field("kept_color", 10, optional, enum, ".fptest2.Color2"),
		},
		NestedType: []*msgProto{
			{Name: proto.String("Grp"), Field: []*fieldProto{field("keep", 1, optional, str, "")}},
			{Name: proto.String("Drop"), Field: []*fieldProto{field("keep", 1, optional, str, "")}},
		},
	}
	addMap(req, ".fptest2.Req2", "by_key", 5, str, msg, ".fptest2.Req2")
	ext := &msgProto{
		Name: proto.String("Ext2"),
		Field: []*fieldProto{
			field("value", 1, optional, str, ""),
			field("sg", 2, optional, group, ".fptest2.Ext2.Sg"),
			field("reqs", 3, repeated, msg, ".fptest2.Req2"),
		},
		NestedType: []*msgProto{{
			Name: proto.String("Sg"),
			Field: []*fieldProto{
				excludedField(field("secret", 1, optional, str, "")),
				field("keep", 2, optional, str, ""),
			},
		}},
		ExtensionRange: []*descriptorpb.DescriptorProto_ExtensionRange{{Start: proto.Int32(100), End: proto.Int32(201)}},
	}
	trace := excludedField(field("trace", 100, optional, str, ""))
	trace.Extendee = proto.String(".fptest2.Ext2")
	reqExt := field("req", 101, optional, msg, ".fptest2.Req2")
	reqExt.Extendee = proto.String(".fptest2.Ext2")
	return newFile(t, &descriptorpb.FileDescriptorProto{
		Name:    proto.String("fingerprint/strip_proto2.proto"),
		Package: proto.String("fptest2"),
		Syntax:  proto.String("proto2"),
		EnumType: []*descriptorpb.EnumDescriptorProto{{
			Name: proto.String("Color2"),
			Value: []*descriptorpb.EnumValueDescriptorProto{
				{Name: proto.String("RED"), Number: proto.Int32(1)},
				{Name: proto.String("BLUE"), Number: proto.Int32(2)},
			},
		}},
		MessageType: []*msgProto{req, ext},
		Extension:   []*fieldProto{trace, reqExt},
	})
}

// stripCheck compares the stripped encodings computed by the package with
// the reference definition.
type stripCheck struct {
	t     *testing.T
	h     *fingerprint.Hasher
	names []protoreflect.FullName
	// often reports whether at least a tenth of the random messages must
	// have an excluded field set, for the check to have tested stripping.
	often bool
	// changed counts the messages that had an excluded field set.
	changed int
}

// describe formats m for a failure message. The text format cannot show
// malformed unknown fields, so the encoding follows.
func describe(m proto.Message) (s string) {
	b, _ := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(m)
	defer func() {
		if recover() != nil {
			s = fmt.Sprintf("encoded %x", b)
		}
	}()
	return fmt.Sprintf("%v\nencoded %x", prototext.Format(m), b)
}

func (c *stripCheck) check(name string, m proto.Message) {
	t := c.t
	t.Helper()
	want := referenceStripped(t, m, c.names)
	full, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err == nil && !bytes.Equal(full, want) {
		c.changed++
	}

	got, err := fingerprint.Stripped(c.h, m)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s: stripped() = %x, %v\nwant %x\nmessage: %v", name, got, err, want, describe(m))
	}
	digest := sha256.Sum256(want)
	if fp := mustSum(t, c.h, m); fp[0] != fingerprint.Version || !bytes.Equal(fp[1:], digest[:]) {
		t.Fatalf("%s: Sum() = %x, want digest %x", name, fp, digest)
	}
}

func TestStrippedEqualsReference(t *testing.T) {
	nodes := nodeFile(t)
	p2 := proto2File(t)
	nodeDesc := nodes.Messages().ByName("Node")
	reqDesc := p2.Messages().ByName("Req2")
	extDesc := p2.Messages().ByName("Ext2")
	everythingDesc := (&everything{}).ProtoReflect().Descriptor()
	extensions := map[protoreflect.FullName][]protoreflect.ExtensionType{
		extDesc.FullName(): {
			dynamicpb.NewExtensionType(p2.Extensions().ByName("trace")),
			dynamicpb.NewExtensionType(p2.Extensions().ByName("req")),
		},
	}
	dynamic := func(md protoreflect.MessageDescriptor) func() protoreflect.Message {
		return func() protoreflect.Message { return dynamicpb.NewMessage(md) }
	}
	generated := func(m proto.Message) func() protoreflect.Message {
		return func() protoreflect.Message { return m.ProtoReflect().New() }
	}

	long := strings.Repeat("n", 120)
	fixed := []proto.Message{
		// The messages of TestGolden.
		&everything{},
		&everything{Text: "hello", Count: 42, Flag: true, Ratio: 1.5, Data: []byte{0, 1, 2, 0xff}, Color: testv1.Everything_COLOR_BLUE},
		&everything{Maybe: proto.Int32(0)},
		&everything{Numbers: []int32{1, -1, 300, 0}},
		&everything{Labels: map[string]string{"b": "2", "a": "1", "c": "3", "": "empty"}},
		&everything{Inner: &inner{Name: "n", Tags: []string{"x", "y"}}},
		&everything{Inners: []*inner{{Name: "first"}, {Tags: []string{"t"}}, {}}},
		&everything{ByName: map[string]*inner{"one": {Name: "1"}, "two": {Name: "2", Tags: []string{"a", "b"}}}},
		&everything{Choice: &testv1.Everything_ChoiceText{ChoiceText: "t"}},
		&everything{Choice: &testv1.Everything_ChoiceNumber{ChoiceNumber: 7}},
		&everything{Choice: &testv1.Everything_ChoiceText{}},
		withUnknown(&everything{Text: "known"}, unknownFields()),
		&everything{
			Text:      "hello",
			RequestId: "req-1",
			Inner:     &inner{Name: "n", Secret: "s"},
			Inners:    []*inner{{Name: "a", Secret: "s1"}, {Secret: "s2"}},
			ByName:    map[string]*inner{"k": {Name: "v", Secret: "s3"}},
		},
		&everything{Text: "hello", Inner: &inner{Name: "n"}, Inners: []*inner{{Name: "a"}, {}}, ByName: map[string]*inner{"k": {Name: "v"}}},
		&testv1.CreatePaymentRequest{CustomerId: "cus_123", AmountCents: 1999, Currency: "EUR", Note: "coffee", TraceId: "4bf92f3577b34da6a3ce929d0e0e4736"},

		// And more.
		fullMessage(),
		withUnknown(fullMessage(), unknownFields()),
		// A length that takes fewer bytes once stripped.
		&everything{Inner: &inner{Name: long, Secret: "secret"}, Inners: []*inner{{Name: long, Secret: "s"}, {Name: long}}},
		&everything{ByName: map[string]*inner{"k": {Name: long, Secret: "secret"}, "nil": nil, "empty": {}}},
		&everything{Inners: []*inner{{Secret: "s"}}},
		// Unknown fields that reuse the numbers of excluded and nested
		// fields are not stripped.
		withUnknown(&everything{RequestId: "r", Inner: withUnknown(&inner{Secret: "s", Name: "n"}, func() []byte {
			b := protowire.AppendTag(nil, 2, protowire.BytesType)
			return protowire.AppendString(b, "unknown secret")
		}()).(*inner)}, func() []byte {
			b := protowire.AppendTag(nil, 15, protowire.BytesType)
			b = protowire.AppendString(b, "unknown request id")
			b = protowire.AppendTag(b, 10, protowire.BytesType)
			in := protowire.AppendTag(nil, 2, protowire.BytesType)
			in = protowire.AppendString(in, "s")
			return protowire.AppendBytes(b, in)
		}()),
		// An excluded field that cannot be encoded is left out.
		&everything{Text: "t", RequestId: "\xff"},
		&everything{Inners: []*inner{{Name: "n", Secret: "\xff"}}},
	}

	type hasher struct {
		names []protoreflect.FullName
		often bool
	}
	suites := []struct {
		name     string
		fixed    []proto.Message
		newMsg   func() protoreflect.Message
		depth    int
		pMessage float64 // 0.3 if zero
		hashers  []hasher
	}{
		{
			name:   "Everything",
			fixed:  fixed,
			newMsg: generated(&everything{}),
			depth:  2,
			hashers: []hasher{
				{often: true},
				{often: true, names: []protoreflect.FullName{
					"idem.test.v1.Everything.text",
					"idem.test.v1.Everything.Inner.name",
					"idem.test.v1.Everything.numbers",
					"idem.test.v1.Everything.labels",
					"idem.test.v1.Everything.choice_number",
				}},
				{often: true, names: []protoreflect.FullName{
					"idem.test.v1.Everything.by_name",
					"idem.test.v1.Everything.Inner.tags",
					"idem.test.v1.Everything.inner",
				}},
			},
		},
		{
			// Dynamic messages are encoded by another implementation,
			// which puts oneofs last.
			name:   "dynamic Everything",
			newMsg: dynamic(everythingDesc),
			depth:  2,
			hashers: []hasher{
				{often: true},
				{often: true, names: []protoreflect.FullName{"idem.test.v1.Everything.choice_text", "idem.test.v1.Everything.Inner.tags"}},
			},
		},
		{
			name:    "CreatePaymentRequest",
			newMsg:  generated(&testv1.CreatePaymentRequest{}),
			hashers: []hasher{{often: true}},
		},
		{
			name:     "Struct",
			newMsg:   generated(&structpb.Struct{}),
			depth:    5,
			pMessage: 0.8,
			hashers: []hasher{
				{often: true, names: []protoreflect.FullName{"google.protobuf.Value.string_value"}},
				{often: true, names: []protoreflect.FullName{
					"google.protobuf.Value.number_value",
					"google.protobuf.Value.null_value",
					"google.protobuf.ListValue.values",
				}},
				{often: false}, // nothing to strip
			},
		},
		{
			name:     "Node",
			newMsg:   dynamic(nodeDesc),
			depth:    4,
			pMessage: 0.06,
			hashers: []hasher{
				{often: true},
				{often: true, names: []protoreflect.FullName{
					"fptest.Node.name",
					"fptest.Node.by_string",
					"fptest.Node.children",
					"fptest.Node.text",
					"fptest.Leaf.a",
				}},
			},
		},
		{
			name:   "Req2",
			newMsg: dynamic(reqDesc),
			depth:  3,
			hashers: []hasher{
				{often: true},
				// A group that holds an excluded field.
				{often: true, names: []protoreflect.FullName{"fptest2.Req2.value", "fptest2.Req2.Grp.keep"}},
			},
		},
		{
			// Extendable: extensions are inspected at run time.
			name:    "Ext2",
			newMsg:  dynamic(extDesc),
			depth:   3,
			hashers: []hasher{{often: true}},
		},
	}

	const random = 300
	for _, s := range suites {
		t.Run(s.name, func(t *testing.T) {
			for _, hs := range s.hashers {
				c := &stripCheck{t: t, h: fingerprint.NewHasher(fingerprint.WithExcludedFields(hs.names...)), names: hs.names, often: hs.often}
				for i, m := range s.fixed {
					c.check(fmt.Sprintf("%v fixed %d", hs.names, i), m)
				}
				f := &filler{r: rand.New(rand.NewPCG(1, uint64(len(s.name)))), extensions: extensions, pMessage: cmp.Or(s.pMessage, 0.3)}
				for i := range random {
					m := s.newMsg()
					f.fill(m, s.depth, false)
					c.check(fmt.Sprintf("%v random %d", hs.names, i), m.Interface())
				}
				if hs.often && c.changed < random/10 {
					t.Errorf("%v: only %d of %d random messages had an excluded field set", hs.names, c.changed, random+len(s.fixed))
				}
			}
		})
	}
}

// TestStripErrors checks that Sum fails exactly where encoding the
// request fails once its excluded fields are cleared.
func TestStripErrors(t *testing.T) {
	p2 := proto2File(t)
	reqDesc := p2.Messages().ByName("Req2")
	req := func(id string, more ...*dynamicpb.Message) *dynamicpb.Message {
		m := dynamicpb.NewMessage(reqDesc)
		if id != "" {
			m.Set(reqDesc.Fields().ByName("id"), protoreflect.ValueOfString(id))
		}
		m.Set(reqDesc.Fields().ByName("value"), protoreflect.ValueOfString("v"))
		l := m.Mutable(reqDesc.Fields().ByName("more")).List()
		for _, r := range more {
			l.Append(protoreflect.ValueOfMessage(r))
		}
		return m
	}
	byKey := func(m *dynamicpb.Message, k string, v *dynamicpb.Message) *dynamicpb.Message {
		m.Mutable(reqDesc.Fields().ByName("by_key")).Map().Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfMessage(v))
		return m
	}

	h := fingerprint.NewHasher()
	tests := map[string]struct {
		m       proto.Message
		wantErr bool
	}{
		"valid":                        {req("a", req("b")), false},
		"missing excluded required":    {req("", req("b")), true},
		"missing nested required":      {req("a", req("b"), req("")), true},
		"missing required in map":      {byKey(req("a"), "k", req("")), true},
		"invalid utf-8 in excluded":    {&everything{Text: "t", RequestId: "\xff"}, false},
		"invalid utf-8 nested exclude": {&everything{Inner: &inner{Secret: "\xff"}}, false},
		"invalid utf-8 beside strip":   {&everything{Text: "\xff", RequestId: "r"}, true},
		"invalid utf-8 in list":        {&everything{Inners: []*inner{{Name: "\xff", Secret: "s"}}}, true},
		"invalid utf-8 in map key":     {&everything{ByName: map[string]*inner{"\xff": {Secret: "s"}}}, true},
	}
	for name, tt := range tests {
		if _, err := h.Sum(tt.m); (err != nil) != tt.wantErr {
			t.Errorf("%s: Sum error %v, want error: %t", name, err, tt.wantErr)
		}
	}
}

// TestStripMalformedGroup strips a request whose group holds malformed
// unknown fields, which hide the group's end in the encoding.
func TestStripMalformedGroup(t *testing.T) {
	reqDesc := proto2File(t).Messages().ByName("Req2")
	fields := reqDesc.Fields()
	m := dynamicpb.NewMessage(reqDesc)
	m.Set(fields.ByName("id"), protoreflect.ValueOfString("id"))
	m.Set(fields.ByName("value"), protoreflect.ValueOfString("v"))
	grp := m.Mutable(fields.ByName("grp")).Message()
	grp.Set(grp.Descriptor().Fields().ByName("keep"), protoreflect.ValueOfString("k"))
	grp.SetUnknown([]byte{0xff})

	h := fingerprint.NewHasher()
	want := referenceStripped(t, m, nil)
	if got, err := fingerprint.Stripped(h, m); err != nil || !bytes.Equal(got, want) {
		t.Errorf("stripped() = %x, %v; want %x", got, err, want)
	}
}

func BenchmarkStripNested(b *testing.B) {
	m := fullMessage()
	h := fingerprint.NewHasher()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Sum(m); err != nil {
			b.Fatal(err)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
