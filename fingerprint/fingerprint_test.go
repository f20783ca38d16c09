package fingerprint_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/fingerprint"
	idemv1 "github.com/idemkit/idem/gen/idem/v1"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

type (
	everything = testv1.Everything
	inner      = testv1.Everything_Inner
)

// unknownFields encodes field 100 = varint 42 and field 101 = "x", which
// Everything does not declare.
func unknownFields() []byte {
	b := protowire.AppendTag(nil, 100, protowire.VarintType)
	b = protowire.AppendVarint(b, 42)
	b = protowire.AppendTag(b, 101, protowire.BytesType)
	return protowire.AppendString(b, "x")
}

func withUnknown(m proto.Message, b []byte) proto.Message {
	m.ProtoReflect().SetUnknown(b)
	return m
}

// TestGolden pins the fingerprints of fixed messages. The expected values
// were computed once by this package and pasted in as literals, so that any
// change to the bytes, from this code or from a protobuf upgrade, fails
// here. Fingerprints are stored by servers: if a change is intentional,
// increase Version and add vectors for it instead of editing these
// literals.
func TestGolden(t *testing.T) {
	tests := []struct {
		name string
		msg  proto.Message
		want string
	}{
		{"empty", &everything{}, "01e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"scalars", &everything{
			Text:  "hello",
			Count: 42,
			Flag:  true,
			Ratio: 1.5,
			Data:  []byte{0, 1, 2, 0xff},
			Color: testv1.Everything_COLOR_BLUE,
		}, "011737d5d2f765f7ca71b3a5ef3e4976add1087a048a9222eab9a336627566a683"},
		{"explicit defaults", &everything{
			Text:  "",
			Count: 0,
			Flag:  false,
			Ratio: 0,
			Data:  []byte{},
			Color: testv1.Everything_COLOR_UNSPECIFIED,
		}, "01e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"optional zero", &everything{Maybe: proto.Int32(0)}, "010c59629d81806b2b169bcd633f8a9cb7da43a8d692dbc95bc201d0f5cf5e08d5"},
		{"packed repeated", &everything{Numbers: []int32{1, -1, 300, 0}}, "010af306558e449b0eb897da723149cd81fda5dacf1308ecaad9bd6c983fddf615"},
		{"map", &everything{Labels: map[string]string{"b": "2", "a": "1", "c": "3", "": "empty"}}, "0115a960350c7735c04bfd4ea2a4112988cbe363b5fa97a6ce82894020cac5b0d1"},
		{"nested", &everything{Inner: &inner{Name: "n", Tags: []string{"x", "y"}}}, "0116eba8dc42181a70d668938198ca8da258f3f7f9a0f19df8a21fb1c78879623f"},
		{"repeated nested", &everything{Inners: []*inner{{Name: "first"}, {Tags: []string{"t"}}, {}}}, "01be4b79c30ca74923c195ced72a655308da822261f30ecc22799172c49e00a0f2"},
		{"map of messages", &everything{ByName: map[string]*inner{
			"one": {Name: "1"},
			"two": {Name: "2", Tags: []string{"a", "b"}},
		}}, "015ee8ecd957a49c18e5c81d026f45c7309cf23e80bae4233c08aca1ef91b7f667"},
		{"oneof text", &everything{Choice: &testv1.Everything_ChoiceText{ChoiceText: "t"}}, "01099e5ef61b852188ba4142d481ccd9e69ca44e3c6a142ae5654a8505f598cc8e"},
		{"oneof number", &everything{Choice: &testv1.Everything_ChoiceNumber{ChoiceNumber: 7}}, "01a90648cc7894b37e690d6b58d5226d995aae8869a79d3edc2136e6dfdc108dda"},
		{"oneof empty text", &everything{Choice: &testv1.Everything_ChoiceText{}}, "0191046df2aa008410555df240b14243aa348b37cd16582c9d8a80ca305afccab2"},
		{"unknown fields", withUnknown(&everything{Text: "known"}, unknownFields()), "01ce61ed40586f60bd5717875220276514512529dcc21dcdb0240c0b506c37f926"},
		{"excluded fields set", &everything{
			Text:      "hello",
			RequestId: "req-1",
			Inner:     &inner{Name: "n", Secret: "s"},
			Inners:    []*inner{{Name: "a", Secret: "s1"}, {Secret: "s2"}},
			ByName:    map[string]*inner{"k": {Name: "v", Secret: "s3"}},
		}, "01c91325e5c1744f8e6d77562942daa71ffbb681439b4a20a000e1a550a0cd6cd6"},
		{"excluded fields unset", &everything{
			Text:   "hello",
			Inner:  &inner{Name: "n"},
			Inners: []*inner{{Name: "a"}, {}},
			ByName: map[string]*inner{"k": {Name: "v"}},
		}, "01c91325e5c1744f8e6d77562942daa71ffbb681439b4a20a000e1a550a0cd6cd6"},
		{"payment", &testv1.CreatePaymentRequest{
			CustomerId:  "cus_123",
			AmountCents: 1999,
			Currency:    "EUR",
			Note:        "coffee",
			TraceId:     "4bf92f3577b34da6a3ce929d0e0e4736",
		}, "0137d2797509339bf6127d586407494f6778efe6c753c5d78fd6655dd9f38bc4f6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fingerprint.Sum(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != tt.want {
				t.Errorf("Sum() = %x, want %s", got, tt.want)
			}
		})
	}
}

func mustSum(t testing.TB, h *fingerprint.Hasher, m proto.Message) []byte {
	t.Helper()
	fp, err := h.Sum(m)
	if err != nil {
		t.Fatalf("Sum(%v): %v", m, err)
	}
	return fp
}

func unmarshal(t *testing.T, b []byte) *everything {
	t.Helper()
	m := &everything{}
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSumFormat(t *testing.T) {
	m := &everything{
		Text:      "hello",
		RequestId: "req-1",
		Inners:    []*inner{{Name: "a", Secret: "s"}},
		Labels:    map[string]string{"b": "2", "a": "1"},
	}
	fp := mustSum(t, fingerprint.NewHasher(), m)
	if len(fp) != 33 {
		t.Fatalf("len = %d, want 33", len(fp))
	}
	if fp[0] != fingerprint.Version {
		t.Errorf("fp[0] = %d, want Version %d", fp[0], fingerprint.Version)
	}

	// The definition: SHA-256 of the deterministic encoding of the message
	// with its excluded fields cleared.
	want := proto.CloneOf(m)
	want.RequestId = ""
	want.Inners[0].Secret = ""
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256(b)
	if !bytes.Equal(fp[1:], digest[:]) {
		t.Errorf("digest = %x, want %x", fp[1:], digest)
	}
}

func TestOmittedEqualsDefault(t *testing.T) {
	// Every implicit-presence scalar of Everything, sent with its default.
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "")
	b = protowire.AppendTag(b, 2, protowire.VarintType)
	b = protowire.AppendVarint(b, 0) // count = 0
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, 0)
	b = protowire.AppendTag(b, 4, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, 0)
	b = protowire.AppendTag(b, 5, protowire.BytesType)
	b = protowire.AppendBytes(b, nil)
	b = protowire.AppendTag(b, 6, protowire.VarintType)
	b = protowire.AppendVarint(b, 0)

	h := fingerprint.NewHasher()
	explicit := mustSum(t, h, unmarshal(t, b))
	omitted := mustSum(t, h, &everything{})
	if !bytes.Equal(explicit, omitted) {
		t.Errorf("explicit defaults %x != omitted fields %x", explicit, omitted)
	}
}

func TestWireOrderDoesNotMatter(t *testing.T) {
	text := func(b []byte) []byte {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		return protowire.AppendString(b, "a")
	}
	count := func(b []byte) []byte {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		return protowire.AppendVarint(b, 5)
	}
	packed := func(b []byte) []byte {
		var p []byte
		p = protowire.AppendVarint(p, 1)
		p = protowire.AppendVarint(p, 2)
		b = protowire.AppendTag(b, 8, protowire.BytesType)
		return protowire.AppendBytes(b, p)
	}
	unpacked := func(b []byte) []byte {
		b = protowire.AppendTag(b, 8, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
		b = protowire.AppendTag(b, 8, protowire.VarintType)
		return protowire.AppendVarint(b, 2)
	}
	innerField := func(b []byte) []byte {
		var in []byte
		in = protowire.AppendTag(in, 3, protowire.BytesType)
		in = protowire.AppendString(in, "tag")
		in = protowire.AppendTag(in, 1, protowire.BytesType)
		in = protowire.AppendString(in, "name")
		b = protowire.AppendTag(b, 10, protowire.BytesType)
		return protowire.AppendBytes(b, in)
	}

	forward := innerField(packed(count(text(nil))))
	backward := text(count(unpacked(innerField(nil))))
	if bytes.Equal(forward, backward) {
		t.Fatal("test encodings are equal")
	}
	h := fingerprint.NewHasher()
	a, b := mustSum(t, h, unmarshal(t, forward)), mustSum(t, h, unmarshal(t, backward))
	if !bytes.Equal(a, b) {
		t.Errorf("fingerprints differ with field order: %x != %x", a, b)
	}
}

func TestMapOrderDoesNotMatter(t *testing.T) {
	entry := func(b []byte, k, v string) []byte {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, v)
		b = protowire.AppendTag(b, 9, protowire.BytesType)
		return protowire.AppendBytes(b, e)
	}
	keys := strings.Split("a b c d e f g h i j k l m n o p", " ")
	var forward, backward []byte
	for i := range keys {
		forward = entry(forward, keys[i], "v"+keys[i])
		j := len(keys) - 1 - i
		backward = entry(backward, keys[j], "v"+keys[j])
	}

	h := fingerprint.NewHasher()
	want := mustSum(t, h, unmarshal(t, forward))
	if got := mustSum(t, h, unmarshal(t, backward)); !bytes.Equal(got, want) {
		t.Errorf("fingerprints differ with map entry order: %x != %x", got, want)
	}
	// Maps built in different insertion orders, each hashed several times:
	// Go randomizes map iteration.
	for range 10 {
		m := &everything{Labels: map[string]string{}}
		for i := len(keys) - 1; i >= 0; i-- {
			m.Labels[keys[i]] = "v" + keys[i]
		}
		if got := mustSum(t, h, m); !bytes.Equal(got, want) {
			t.Fatalf("fingerprints differ with map insertion order: %x != %x", got, want)
		}
	}
}

func TestPresence(t *testing.T) {
	h := fingerprint.NewHasher()
	if bytes.Equal(mustSum(t, h, &everything{Maybe: proto.Int32(0)}), mustSum(t, h, &everything{})) {
		t.Error("optional field set to 0 has the fingerprint of an absent one")
	}
	if bytes.Equal(mustSum(t, h, &everything{Inner: &inner{}}), mustSum(t, h, &everything{})) {
		t.Error("empty message field has the fingerprint of an unset one")
	}
}

func TestDifferentValues(t *testing.T) {
	msgs := map[string]proto.Message{
		"empty":           &everything{},
		"text":            &everything{Text: "a"},
		"text b":          &everything{Text: "b"},
		"count":           &everything{Count: 1},
		"count 2":         &everything{Count: 2},
		"flag":            &everything{Flag: true},
		"ratio":           &everything{Ratio: 1},
		"data":            &everything{Data: []byte("a")},
		"color":           &everything{Color: testv1.Everything_COLOR_RED},
		"maybe":           &everything{Maybe: proto.Int32(1)},
		"numbers 1 2":     &everything{Numbers: []int32{1, 2}},
		"numbers 2 1":     &everything{Numbers: []int32{2, 1}},
		"labels":          &everything{Labels: map[string]string{"a": "1"}},
		"labels value":    &everything{Labels: map[string]string{"a": "2"}},
		"labels key":      &everything{Labels: map[string]string{"b": "1"}},
		"inner name":      &everything{Inner: &inner{Name: "a"}},
		"inner tags":      &everything{Inner: &inner{Tags: []string{"a"}}},
		"inners":          &everything{Inners: []*inner{{Name: "a"}}},
		"inners two":      &everything{Inners: []*inner{{Name: "a"}, {}}},
		"by_name":         &everything{ByName: map[string]*inner{"a": {Name: "a"}}},
		"by_name value":   &everything{ByName: map[string]*inner{"a": {Name: "b"}}},
		"choice text":     &everything{Choice: &testv1.Everything_ChoiceText{ChoiceText: "1"}},
		"choice number":   &everything{Choice: &testv1.Everything_ChoiceNumber{ChoiceNumber: 1}},
		"unknown":         withUnknown(&everything{}, unknownFields()),
		"payment":         &testv1.CreatePaymentRequest{AmountCents: 100},
		"payment 2":       &testv1.CreatePaymentRequest{AmountCents: 200},
		"payment note":    &testv1.CreatePaymentRequest{AmountCents: 100, Note: "x"},
		"do request":      &testv1.DoRequest{Value: "do a"},
		"do request diff": &testv1.DoRequest{Value: "do b"},
	}
	h := fingerprint.NewHasher()
	seen := make(map[string]string)
	for name, m := range msgs {
		fp := string(mustSum(t, h, m))
		if other, ok := seen[fp]; ok {
			t.Errorf("%s and %s have the same fingerprint %x", name, other, fp)
		}
		seen[fp] = name
	}
}

// fullMessage sets every field of Everything, including the excluded ones
// at every depth.
func fullMessage() *everything {
	return &everything{
		Text:    "text",
		Count:   3,
		Flag:    true,
		Ratio:   2.5,
		Data:    []byte{1, 2, 3},
		Color:   testv1.Everything_COLOR_RED,
		Maybe:   proto.Int32(0),
		Numbers: []int32{3, 1, 2},
		Labels:  map[string]string{"x": "1", "y": "2"},
		Inner:   &inner{Name: "inner", Secret: "s0", Tags: []string{"a"}},
		Inners: []*inner{
			{Name: "i0", Tags: []string{"b"}},
			{Name: "i1", Secret: "s1"},
			{Name: "i2", Secret: "s2", Tags: []string{"c", "d"}},
		},
		ByName: map[string]*inner{
			"k0": {Name: "v0"},
			"k1": {Name: "v1", Secret: "s3"},
		},
		Choice:    &testv1.Everything_ChoiceText{ChoiceText: "choice"},
		RequestId: "req",
	}
}

func TestExcludedFields(t *testing.T) {
	h := fingerprint.NewHasher()
	base := fullMessage()
	want := mustSum(t, h, base)

	same := map[string]func(m *everything){
		"top level cleared":    func(m *everything) { m.RequestId = "" },
		"top level changed":    func(m *everything) { m.RequestId = "other" },
		"nested cleared":       func(m *everything) { m.Inner.Secret = "" },
		"nested changed":       func(m *everything) { m.Inner.Secret = "other" },
		"list element cleared": func(m *everything) { m.Inners[1].Secret = "" },
		"list element set":     func(m *everything) { m.Inners[0].Secret = "new" },
		"map value cleared":    func(m *everything) { m.ByName["k1"].Secret = "" },
		"map value set":        func(m *everything) { m.ByName["k0"].Secret = "new" },
		"all cleared": func(m *everything) {
			m.RequestId = ""
			m.Inner.Secret = ""
			for _, in := range m.Inners {
				in.Secret = ""
			}
			for _, in := range m.ByName {
				in.Secret = ""
			}
		},
	}
	for name, change := range same {
		m := fullMessage()
		change(m)
		if got := mustSum(t, h, m); !bytes.Equal(got, want) {
			t.Errorf("%s: fingerprint changed: %x != %x", name, got, want)
		}
	}

	different := map[string]func(m *everything){
		"top level sibling":    func(m *everything) { m.Text = "other" },
		"nested sibling":       func(m *everything) { m.Inner.Name = "other" },
		"list element sibling": func(m *everything) { m.Inners[1].Name = "other" },
		"clean list element":   func(m *everything) { m.Inners[0].Tags = nil },
		"list order":           func(m *everything) { m.Inners[1], m.Inners[2] = m.Inners[2], m.Inners[1] },
		"map value sibling":    func(m *everything) { m.ByName["k1"].Tags = []string{"t"} },
		"clean map value":      func(m *everything) { m.ByName["k0"].Name = "other" },
		"map key":              func(m *everything) { m.ByName["k2"] = m.ByName["k1"]; delete(m.ByName, "k1") },
		"scalar beside strip":  func(m *everything) { m.Maybe = nil },
		"unknown fields":       func(m *everything) { m.ProtoReflect().SetUnknown(unknownFields()) },
		"unknown nested": func(m *everything) {
			m.Inners[1].ProtoReflect().SetUnknown(unknownFields())
		},
	}
	for name, change := range different {
		m := fullMessage()
		change(m)
		if got := mustSum(t, h, m); bytes.Equal(got, want) {
			t.Errorf("%s: fingerprint did not change", name)
		}
	}

	for _, pair := range [][2]proto.Message{
		{&testv1.DoRequest{Value: "v", TraceId: "a"}, &testv1.DoRequest{Value: "v"}},
		{
			&testv1.CreatePaymentRequest{CustomerId: "c", AmountCents: 1, TraceId: "a"},
			&testv1.CreatePaymentRequest{CustomerId: "c", AmountCents: 1, TraceId: "b"},
		},
	} {
		if a, b := mustSum(t, h, pair[0]), mustSum(t, h, pair[1]); !bytes.Equal(a, b) {
			t.Errorf("%v and %v: %x != %x", pair[0], pair[1], a, b)
		}
	}
}

func TestWithExcludedFields(t *testing.T) {
	h := fingerprint.NewHasher(
		fingerprint.WithExcludedFields("idem.test.v1.Everything.text"),
		fingerprint.WithExcludedFields("idem.test.v1.Everything.Inner.name", "no.such.Field"),
	)
	def := fingerprint.NewHasher()

	base := fullMessage()
	changes := map[string]func(m *everything){
		"top level":    func(m *everything) { m.Text = "other" },
		"nested":       func(m *everything) { m.Inner.Name = "other" },
		"list element": func(m *everything) { m.Inners[0].Name = "" },
		"map value":    func(m *everything) { m.ByName["k0"].Name = "other" },
	}
	for name, change := range changes {
		m := fullMessage()
		change(m)
		if !bytes.Equal(mustSum(t, h, m), mustSum(t, h, base)) {
			t.Errorf("%s: fingerprint changed with an excluded field", name)
		}
		if bytes.Equal(mustSum(t, def, m), mustSum(t, def, base)) {
			t.Errorf("%s: default Hasher ignored a field it does not exclude", name)
		}
	}

	// Marked fields stay excluded.
	m := fullMessage()
	m.RequestId = "other"
	m.Inners[1].Secret = "other"
	if !bytes.Equal(mustSum(t, h, m), mustSum(t, h, base)) {
		t.Error("marked fields are not excluded with WithExcludedFields")
	}
	// Other fields still count.
	m = fullMessage()
	m.Inner.Tags = nil
	if bytes.Equal(mustSum(t, h, m), mustSum(t, h, base)) {
		t.Error("a field that is not excluded did not change the fingerprint")
	}

	// A field of a message without marked fields.
	p := fingerprint.NewHasher(fingerprint.WithExcludedFields("idem.test.v1.MaybeRequest.value"))
	if !bytes.Equal(mustSum(t, p, &testv1.MaybeRequest{Value: "a"}), mustSum(t, p, &testv1.MaybeRequest{})) {
		t.Error("MaybeRequest.value is not excluded")
	}
}

func TestRecursiveTypes(t *testing.T) {
	// google.protobuf.Value holds Struct and ListValue, which hold Value.
	doc := func(s string, n float64) *structpb.Struct {
		v, err := structpb.NewStruct(map[string]any{
			"a": map[string]any{"b": []any{s, n, map[string]any{"c": s}}},
			"d": s,
		})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	h := fingerprint.NewHasher(fingerprint.WithExcludedFields("google.protobuf.Value.string_value"))
	if !bytes.Equal(mustSum(t, h, doc("x", 1)), mustSum(t, h, doc("y", 1))) {
		t.Error("excluded string_value changed the fingerprint")
	}
	if bytes.Equal(mustSum(t, h, doc("x", 1)), mustSum(t, h, doc("x", 2))) {
		t.Error("number_value did not change the fingerprint")
	}
	def := fingerprint.NewHasher()
	if bytes.Equal(mustSum(t, def, doc("x", 1)), mustSum(t, def, doc("y", 1))) {
		t.Error("default Hasher ignored string_value")
	}
}

func TestDoesNotModifyMessage(t *testing.T) {
	hashers := map[string]*fingerprint.Hasher{
		"default":  fingerprint.NewHasher(),
		"excluded": fingerprint.NewHasher(fingerprint.WithExcludedFields("idem.test.v1.Everything.Inner.tags")),
	}
	for name, h := range hashers {
		m := fullMessage()
		m.ProtoReflect().SetUnknown(unknownFields())
		m.Inners[1].ProtoReflect().SetUnknown(unknownFields())
		before := proto.CloneOf(m)
		inners, k1 := m.Inners, m.ByName["k1"]

		mustSum(t, h, m)

		if !proto.Equal(m, before) {
			t.Errorf("%s: message changed:\n got %v\nwant %v", name, m, before)
		}
		if m.RequestId == "" || m.Inner.Secret == "" || m.Inners[1].Secret == "" || m.ByName["k1"].Secret == "" {
			t.Errorf("%s: excluded fields cleared: %v", name, m)
		}
		if len(m.Inners) != len(inners) || &m.Inners[0] != &inners[0] || m.Inners[1] != inners[1] {
			t.Errorf("%s: list replaced", name)
		}
		if len(m.ByName) != 2 || m.ByName["k1"] != k1 {
			t.Errorf("%s: map changed", name)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	msgs := []proto.Message{
		fullMessage(),
		&everything{Text: "a"},
		&testv1.DoRequest{Value: "v", TraceId: "t"},
		&testv1.CreatePaymentRequest{CustomerId: "c", TraceId: "t"},
		&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("s")}},
	}
	want := make([][]byte, len(msgs))
	for i, m := range msgs {
		want[i] = mustSum(t, fingerprint.NewHasher(), m)
	}

	h := fingerprint.NewHasher() // shared, with an empty cache
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 32 {
		wg.Go(func() {
			for n := range 50 {
				i := (g + n) % len(msgs)
				got, err := h.Sum(msgs[i])
				if err != nil || !bytes.Equal(got, want[i]) {
					select {
					case errs <- fmt.Sprintf("Sum(%v) = %x, %v; want %x", msgs[i], got, err, want[i]):
					default:
					}
				}
				if got, err := fingerprint.Sum(msgs[i]); err != nil || !bytes.Equal(got, want[i]) {
					select {
					case errs <- fmt.Sprintf("package Sum(%v) = %x, %v; want %x", msgs[i], got, err, want[i]):
					default:
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestErrors(t *testing.T) {
	tests := map[string]proto.Message{
		"nil":                  nil,
		"typed nil":            (*everything)(nil),
		"invalid utf-8":        &everything{Text: "\xff"},
		"invalid utf-8 nested": &everything{Inners: []*inner{{Name: "\xff", Secret: "s"}}},
		"invalid utf-8 strip":  &everything{Text: "\xff", RequestId: "r"},
	}
	for name, m := range tests {
		fp, err := fingerprint.Sum(m)
		if err == nil {
			t.Errorf("%s: Sum() = %x, want an error", name, fp)
			continue
		}
		if !strings.HasPrefix(err.Error(), "fingerprint: ") {
			t.Errorf("%s: error %q lacks the prefix", name, err)
		}
	}
}

func TestDynamicMessage(t *testing.T) {
	m := fullMessage()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	dm := dynamicpb.NewMessage(m.ProtoReflect().Descriptor())
	if err := proto.Unmarshal(b, dm); err != nil {
		t.Fatal(err)
	}
	before := proto.Clone(dm)

	h := fingerprint.NewHasher()
	if got, want := mustSum(t, h, dm), mustSum(t, h, m); !bytes.Equal(got, want) {
		t.Errorf("dynamic message: %x, generated message: %x", got, want)
	}
	if !proto.Equal(dm, before) {
		t.Errorf("dynamic message changed:\n got %v\nwant %v", dm, before)
	}
}

// newFile builds a file descriptor that is not in the global registry.
func newFile(t *testing.T, fdp *descriptorpb.FileDescriptorProto) protoreflect.FileDescriptor {
	t.Helper()
	fd, err := protodesc.NewFile(fdp, new(protoregistry.Files))
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func excludedOption() *descriptorpb.FieldOptions {
	o := &descriptorpb.FieldOptions{}
	proto.SetExtension(o, idemv1.E_Field, &idemv1.FieldPolicy{FingerprintExclude: true})
	return o
}

func TestSameNameOtherDescriptor(t *testing.T) {
	// Another version of idem.test.v1.Everything in which request_id is not
	// marked.
	fd := newFile(t, &descriptorpb.FileDescriptorProto{
		Name:    proto.String("other/test.proto"),
		Package: proto.String("idem.test.v1"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Everything"),
			Field: []*descriptorpb.FieldDescriptorProto{
				{
					Name:   proto.String("text"),
					Number: proto.Int32(1),
					Type:   descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(),
					Label:  descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				},
				{
					Name:   proto.String("request_id"),
					Number: proto.Int32(15),
					Type:   descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(),
					Label:  descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				},
			},
		}},
	})
	md := fd.Messages().ByName("Everything")
	other := func(id string) proto.Message {
		m := dynamicpb.NewMessage(md)
		m.Set(md.Fields().ByName("text"), protoreflect.ValueOfString("t"))
		m.Set(md.Fields().ByName("request_id"), protoreflect.ValueOfString(id))
		return m
	}

	h := fingerprint.NewHasher()
	mustSum(t, h, &everything{Text: "t", RequestId: "a"}) // caches the generated type's plan
	if bytes.Equal(mustSum(t, h, other("a")), mustSum(t, h, other("b"))) {
		t.Error("request_id of the other descriptor is excluded")
	}
	if !bytes.Equal(mustSum(t, h, &everything{Text: "t", RequestId: "a"}), mustSum(t, h, &everything{Text: "t"})) {
		t.Error("request_id of the generated descriptor is not excluded")
	}
}

func TestProto2(t *testing.T) {
	// message Req {
	//   required string id = 1 [(idem.v1.field).fingerprint_exclude = true];
	//   optional string value = 2;
	// }
	// message Open {
	//   optional string value = 1;
	//   extensions 100 to 200;
	// }
	// message Holder {
	//   repeated Req reqs = 1;
	//   optional Open open = 2;
	// }
	// extend Open {
	//   optional string trace = 100 [(idem.v1.field).fingerprint_exclude = true];
	//   optional string extra = 101;
	// }
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	msg := descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
	optional := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	fd := newFile(t, &descriptorpb.FileDescriptorProto{
		Name:    proto.String("fingerprint/proto2.proto"),
		Package: proto.String("fingerprinttest"),
		Syntax:  proto.String("proto2"),
		MessageType: []*descriptorpb.DescriptorProto{
			{
				Name: proto.String("Req"),
				Field: []*descriptorpb.FieldDescriptorProto{
					{
						Name: proto.String("id"), Number: proto.Int32(1), Type: str,
						Label:   descriptorpb.FieldDescriptorProto_LABEL_REQUIRED.Enum(),
						Options: excludedOption(),
					},
					{Name: proto.String("value"), Number: proto.Int32(2), Type: str, Label: optional},
				},
			},
			{
				Name: proto.String("Open"),
				Field: []*descriptorpb.FieldDescriptorProto{
					{Name: proto.String("value"), Number: proto.Int32(1), Type: str, Label: optional},
				},
				ExtensionRange: []*descriptorpb.DescriptorProto_ExtensionRange{{Start: proto.Int32(100), End: proto.Int32(201)}},
			},
			{
				Name: proto.String("Holder"),
				Field: []*descriptorpb.FieldDescriptorProto{
					{
						Name: proto.String("reqs"), Number: proto.Int32(1), Type: msg,
						TypeName: proto.String(".fingerprinttest.Req"),
						Label:    descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(),
					},
					{
						Name: proto.String("open"), Number: proto.Int32(2), Type: msg,
						TypeName: proto.String(".fingerprinttest.Open"), Label: optional,
					},
				},
			},
		},
		Extension: []*descriptorpb.FieldDescriptorProto{
			{
				Name: proto.String("trace"), Number: proto.Int32(100), Type: str, Label: optional,
				Extendee: proto.String(".fingerprinttest.Open"), Options: excludedOption(),
			},
			{
				Name: proto.String("extra"), Number: proto.Int32(101), Type: str, Label: optional,
				Extendee: proto.String(".fingerprinttest.Open"),
			},
		},
	})
	reqDesc := fd.Messages().ByName("Req")
	openDesc := fd.Messages().ByName("Open")
	holderDesc := fd.Messages().ByName("Holder")
	trace := dynamicpb.NewExtensionType(fd.Extensions().ByName("trace")).TypeDescriptor()
	extra := dynamicpb.NewExtensionType(fd.Extensions().ByName("extra")).TypeDescriptor()

	newMessage := func(md protoreflect.MessageDescriptor, fields map[protoreflect.FieldDescriptor]string) *dynamicpb.Message {
		m := dynamicpb.NewMessage(md)
		for f, v := range fields {
			m.Set(f, protoreflect.ValueOfString(v))
		}
		return m
	}
	req := func(id, value string) *dynamicpb.Message {
		fields := map[protoreflect.FieldDescriptor]string{reqDesc.Fields().ByName("value"): value}
		if id != "" {
			fields[reqDesc.Fields().ByName("id")] = id
		}
		return newMessage(reqDesc, fields)
	}
	open := func(traceValue, extraValue string) *dynamicpb.Message {
		fields := map[protoreflect.FieldDescriptor]string{openDesc.Fields().ByName("value"): "v"}
		if traceValue != "" {
			fields[trace] = traceValue
		}
		if extraValue != "" {
			fields[extra] = extraValue
		}
		return newMessage(openDesc, fields)
	}
	holder := func(o *dynamicpb.Message, reqs ...*dynamicpb.Message) proto.Message {
		m := dynamicpb.NewMessage(holderDesc)
		l := m.Mutable(holderDesc.Fields().ByName("reqs")).List()
		for _, r := range reqs {
			l.Append(protoreflect.ValueOfMessage(r))
		}
		m.Set(holderDesc.Fields().ByName("open"), protoreflect.ValueOfMessage(o))
		return m
	}
	h := fingerprint.NewHasher()

	// A required field that is excluded must still be set, as for encoding.
	if _, err := h.Sum(req("", "v")); err == nil {
		t.Error("missing required field: no error")
	}
	if !bytes.Equal(mustSum(t, h, req("a", "v")), mustSum(t, h, req("b", "v"))) {
		t.Error("excluded required field changed the fingerprint")
	}
	if bytes.Equal(mustSum(t, h, req("a", "v")), mustSum(t, h, req("a", "w"))) {
		t.Error("optional field did not change the fingerprint")
	}

	// Extensions.
	o := open("t1", "e")
	before := proto.Clone(o)
	want := mustSum(t, h, o)
	if !proto.Equal(o, before) {
		t.Errorf("message changed:\n got %v\nwant %v", o, before)
	}
	if !bytes.Equal(mustSum(t, h, open("t2", "e")), want) || !bytes.Equal(mustSum(t, h, open("", "e")), want) {
		t.Error("excluded extension changed the fingerprint")
	}
	if bytes.Equal(mustSum(t, h, open("t1", "f")), want) {
		t.Error("extension that is not excluded did not change the fingerprint")
	}

	// Both, nested.
	want = mustSum(t, h, holder(open("", "e"), req("a", "v"), req("b", "w")))
	if got := mustSum(t, h, holder(open("t", "e"), req("c", "v"), req("d", "w"))); !bytes.Equal(got, want) {
		t.Error("excluded fields of nested messages changed the fingerprint")
	}
	if got := mustSum(t, h, holder(open("t", "f"), req("c", "v"), req("d", "w"))); bytes.Equal(got, want) {
		t.Error("nested extension did not change the fingerprint")
	}
	if _, err := h.Sum(holder(open("", ""), req("a", "v"), req("", "w"))); err == nil {
		t.Error("missing nested required field: no error")
	}
}

// A field that carries the call's idempotency key ((idem.v1.field).key)
// names the request and is not part of its fingerprint.
func TestKeyFieldIsExcluded(t *testing.T) {
	a, err := fingerprint.Sum(&testv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 100, RequestId: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := fingerprint.Sum(&testv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 100, RequestId: "req-2"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := fingerprint.Sum(&testv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 200, RequestId: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) || bytes.Equal(a, c) {
		t.Errorf("fingerprints %x, %x, %x; want the first two equal and the third apart", a, b, c)
	}
}
