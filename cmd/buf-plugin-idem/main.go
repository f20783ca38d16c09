// Command buf-plugin-idem is a buf check plugin whose lint rule
// IDEM_METHOD_POLICY fails on a method that looks mutating and says nothing
// about idempotency: no (idem.v1.method) option, no idempotency_level of
// IDEMPOTENT or NO_SIDE_EFFECTS, and no buf comment ignore; and on an
// (idem.v1.method) option that sets a field idem would ignore: lease or
// finish with a mode other than MODE_LEASED, finish_headers without
// finish.
//
// # Mutating
//
// A unary method looks mutating when a google.api.http rule (or one of its
// additional_bindings) maps it to POST, PUT, PATCH or DELETE (or to a custom
// verb other than GET, HEAD or OPTIONS), or when its name begins with one
// of the mutating prefixes as a whole word: CreateOrder and Set match
// Create and Set, Settings and Address match neither Set nor Add. The
// default prefixes are Create, Update, Delete, Set, Add, Remove, Cancel,
// Insert, Upsert, Replace, Patch, Put, Post, Undelete, Send, Submit, Place,
// Pay, Charge, Refund, Capture, Transfer, Reserve, Release, Approve, Reject
// and Publish; the option mutating_prefixes replaces them.
//
// Streaming methods are never reported: idem keys unary methods only, and
// its adapters refuse a key on a stream.
//
// # Exempt
//
// A mutating method passes when it carries the (idem.v1.method) option
// (key_required = false says "keys are welcome, not required"), or
// when its idempotency_level is IDEMPOTENT or NO_SIDE_EFFECTS: idem never
// keys those. To keep a mutating method out of idem on purpose, put buf's
// comment ignore, with the reason, in its leading comment:
//
//	// buf:lint:ignore IDEM_METHOD_POLICY the ledger dedupes on transfer_id.
//	rpc Transfer(TransferRequest) returns (TransferResponse);
//
// # Use
//
//	# buf.yaml
//	version: v2
//	lint:
//	  use:
//	    - STANDARD
//	    - IDEM_METHOD_POLICY
//	plugins:
//	  - plugin: buf-plugin-idem
//	    options:
//	      # optional: replaces the default prefixes
//	      mutating_prefixes: [Create, Update, Delete, Cancel]
//
// then `buf lint`. Install the plugin with
// `go install github.com/idemkit/idem/cmd/buf-plugin-idem@latest`, or pin
// it in a tools module (`go get -tool`) and name it as
// `plugin: [go, tool, buf-plugin-idem]`.
package main

import (
	"context"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"buf.build/go/bufplugin/check"
	"buf.build/go/bufplugin/check/checkutil"
	"buf.build/go/bufplugin/descriptor"
	"buf.build/go/bufplugin/info"
	"buf.build/go/bufplugin/option"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

const (
	// ruleID is the lint rule's ID, for buf.yaml's lint.use and for
	// "buf:lint:ignore" comments.
	ruleID = "IDEM_METHOD_POLICY"
	// prefixesOption names the option that replaces defaultPrefixes.
	prefixesOption = "mutating_prefixes"

	// methodOption is idem's method option (proto/idem/v1/options.proto).
	methodOption protoreflect.FullName = "idem.v1.method"
	// httpOption is Google's HTTP rule (google/api/annotations.proto).
	httpOption protoreflect.FullName = "google.api.http"
)

// defaultPrefixes are the method-name prefixes that make a method look
// mutating when the option mutating_prefixes is not set: Google's standard
// mutating methods (AIP-133, 134, 135) and the verbs of common custom
// methods that change state.
var defaultPrefixes = []string{
	"Create", "Update", "Delete", "Set", "Add", "Remove", "Cancel",
	"Insert", "Upsert", "Replace", "Patch", "Put", "Post", "Undelete",
	"Send", "Submit", "Place", "Pay", "Charge", "Refund", "Capture",
	"Transfer", "Reserve", "Release", "Approve", "Reject", "Publish",
}

var spec = &check.Spec{
	Rules: []*check.RuleSpec{{
		ID:      ruleID,
		Default: true,
		Purpose: "Checks that every unary method that looks mutating (a POST, PUT, PATCH or DELETE HTTP rule, or a name such as Create…) has an (idem.v1.method) option or is IDEMPOTENT or NO_SIDE_EFFECTS, and that no such option sets a field its mode ignores.",
		Type:    check.RuleTypeLint,
		Handler: checkutil.NewFileRuleHandler(checkFile, checkutil.WithoutImports()),
	}},
	Info: &info.Spec{
		Documentation: "Reports mutating-looking gRPC methods that carry no idempotency policy for idem (github.com/idemkit/idem).",
		SPDXLicenseID: "Apache-2.0",
		LicenseURL:    "https://github.com/idemkit/idem/blob/main/LICENSE",
	},
}

func main() {
	check.Main(spec)
}

// checkFile reports the file's unmarked mutating methods.
func checkFile(_ context.Context, w check.ResponseWriter, req check.Request, file descriptor.FileDescriptor) error {
	prefixes, err := option.GetStringSliceValue(req.Options(), prefixesOption)
	if err != nil {
		return err
	}
	if prefixes == nil {
		prefixes = defaultPrefixes
	}
	types := methodOptionTypes(req.FileDescriptors())
	services := file.ProtoreflectFileDescriptor().Services()
	for i := range services.Len() {
		methods := services.Get(i).Methods()
		for j := range methods.Len() {
			md := methods.Get(j)
			opts, err := methodOptions(md, types)
			if err != nil {
				return fmt.Errorf("%s: %w", md.FullName(), err)
			}
			for _, msg := range ignoredFields(opts, types) {
				w.AddAnnotation(check.WithDescriptor(md), check.WithMessagef("%s: %s.", md.FullName(), msg))
			}
			why := mutating(md, opts, types, prefixes)
			if why == "" || exempt(md, opts, types) {
				continue
			}
			w.AddAnnotation(
				check.WithDescriptor(md),
				check.WithMessagef("%s looks mutating (%s) but has no (%s) option: set one, mark it idempotency_level = IDEMPOTENT, or opt out with a leading comment \"// buf:lint:ignore %s <reason>\".",
					md.FullName(), why, methodOption, ruleID),
			)
		}
	}
	return nil
}

// ignoredFields returns what the method's (idem.v1.method) option sets
// that idem ignores, as idem.New refuses it in an idem.MethodPolicy: lease
// or finish in a mode other than MODE_LEASED, finish_headers without
// finish.
func ignoredFields(opts protoreflect.Message, types *protoregistry.Types) []string {
	xt, err := types.FindExtensionByName(methodOption)
	if err != nil || !opts.Has(xt.TypeDescriptor()) {
		return nil
	}
	policy := opts.Get(xt.TypeDescriptor()).Message()
	fields := policy.Descriptor().Fields()
	has := func(name protoreflect.Name) bool {
		fd := fields.ByName(name)
		return fd != nil && policy.Has(fd)
	}
	mode := "unset (MODE_ATOMIC)"
	if fd := fields.ByName("mode"); fd != nil && policy.Has(fd) {
		ev := fd.Enum().Values().ByNumber(policy.Get(fd).Enum())
		if ev == nil {
			mode = fmt.Sprint(policy.Get(fd).Enum())
		} else {
			mode = string(ev.Name())
		}
	}
	var out []string
	if mode != "MODE_LEASED" {
		for _, f := range []protoreflect.Name{"lease", "finish"} {
			if has(f) {
				out = append(out, fmt.Sprintf("(%s).%s is set, but mode is %s: only MODE_LEASED reads it", methodOption, f, mode))
			}
		}
	}
	if has("finish_headers") && !has("finish") {
		out = append(out, fmt.Sprintf("(%s).finish_headers is set without finish: nothing keeps the headers for a finisher", methodOption))
	}
	return out
}

// exempt reports whether the method says how it is retried, or streams.
func exempt(md protoreflect.MethodDescriptor, opts protoreflect.Message, types *protoregistry.Types) bool {
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return true
	}
	if xt, err := types.FindExtensionByName(methodOption); err == nil && opts.Has(xt.TypeDescriptor()) {
		return true
	}
	level := opts.Get(opts.Descriptor().Fields().ByName("idempotency_level")).Enum()
	return level == protoreflect.EnumNumber(descriptorpb.MethodOptions_IDEMPOTENT) ||
		level == protoreflect.EnumNumber(descriptorpb.MethodOptions_NO_SIDE_EFFECTS)
}

// mutating says why the method looks mutating, or "" when it does not.
func mutating(md protoreflect.MethodDescriptor, opts protoreflect.Message, types *protoregistry.Types, prefixes []string) string {
	if xt, err := types.FindExtensionByName(httpOption); err == nil && opts.Has(xt.TypeDescriptor()) {
		if verb := mutatingHTTPRule(opts.Get(xt.TypeDescriptor()).Message()); verb != "" {
			return "google.api.http " + verb
		}
	}
	if p, ok := mutatingName(string(md.Name()), prefixes); ok {
		return fmt.Sprintf("its name begins with %q", p)
	}
	return ""
}

// mutatingHTTPRule returns the first mutating HTTP verb of a
// google.api.HttpRule and of its additional bindings, or "".
func mutatingHTTPRule(rule protoreflect.Message) string {
	fields := rule.Descriptor().Fields()
	for _, verb := range []protoreflect.Name{"post", "put", "patch", "delete"} {
		if fd := fields.ByName(verb); fd != nil && rule.Has(fd) {
			return strings.ToUpper(string(verb))
		}
	}
	if fd := fields.ByName("custom"); fd != nil && rule.Has(fd) {
		custom := rule.Get(fd).Message()
		if kd := custom.Descriptor().Fields().ByName("kind"); kd != nil {
			switch kind := strings.ToUpper(custom.Get(kd).String()); kind {
			case "GET", "HEAD", "OPTIONS":
			default:
				return kind
			}
		}
	}
	if fd := fields.ByName("additional_bindings"); fd != nil {
		list := rule.Get(fd).List()
		for i := range list.Len() {
			if verb := mutatingHTTPRule(list.Get(i).Message()); verb != "" {
				return verb
			}
		}
	}
	return ""
}

// mutatingName returns the prefix that name begins with as a whole word of
// its CamelCase: the name ends there, or goes on with an upper-case letter
// or a digit.
func mutatingName(name string, prefixes []string) (string, bool) {
	for _, p := range prefixes {
		rest, ok := strings.CutPrefix(name, p)
		if !ok || p == "" {
			continue
		}
		if r, _ := utf8.DecodeRuneInString(rest); rest == "" || unicode.IsUpper(r) || unicode.IsDigit(r) || r == '_' {
			return p, true
		}
	}
	return "", false
}

// methodOptionTypes resolves the extensions of google.protobuf.MethodOptions
// that the request's files declare (idem's and Google's among them): buf
// hands the plugin options it cannot decode itself, as unknown fields,
// unless the plugin's binary links their Go types, which this one does not
// need to.
func methodOptionTypes(files []descriptor.FileDescriptor) *protoregistry.Types {
	types := new(protoregistry.Types)
	var add func(protoreflect.ExtensionDescriptors)
	add = func(xds protoreflect.ExtensionDescriptors) {
		for i := range xds.Len() {
			xd := xds.Get(i)
			if xd.ContainingMessage().FullName() == "google.protobuf.MethodOptions" {
				// A second file declaring the same name is a compile error buf
				// reports before any plugin runs.
				_ = types.RegisterExtension(dynamicpb.NewExtensionType(xd))
			}
		}
	}
	var walk func(protoreflect.MessageDescriptors)
	walk = func(mds protoreflect.MessageDescriptors) {
		for i := range mds.Len() {
			add(mds.Get(i).Extensions())
			walk(mds.Get(i).Messages())
		}
	}
	for _, f := range files {
		fd := f.ProtoreflectFileDescriptor()
		add(fd.Extensions())
		walk(fd.Messages())
	}
	return types
}

// methodOptions decodes the method's options again with the extensions of
// types, whether they arrived as unknown fields or typed.
func methodOptions(md protoreflect.MethodDescriptor, types *protoregistry.Types) (protoreflect.Message, error) {
	opts := &descriptorpb.MethodOptions{}
	if m := md.Options(); m != nil {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return nil, err
		}
		if err := (proto.UnmarshalOptions{Resolver: types}).Unmarshal(b, opts); err != nil {
			return nil, err
		}
	}
	return opts.ProtoReflect(), nil
}
