package main

import (
	"fmt"

	"github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2/options"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// idem's options (proto/idem/v1/options.proto), read by name.
const (
	methodOption protoreflect.FullName = "idem.v1.method"
	fieldOption  protoreflect.FullName = "idem.v1.field"
	leasedMode   protoreflect.Name     = "MODE_LEASED"
)

// markName is the vendor extension that marks the operations of keyed
// methods between protoc-gen-openapiv2 and the patch. Its value is a
// keyed, as JSON.
const markName = "x-idem-key"

// keyed is what the patch needs to know of a keyed method.
type keyed struct {
	// Required: the method sets key_required.
	Required bool `json:"required"`
	// Field names the request field that carries the key instead of the
	// header, as "request_id (JSON requestId)"; empty when none does.
	Field string `json:"field,omitempty"`
	// Leased: the method's mode is MODE_LEASED.
	Leased bool `json:"leased,omitempty"`
}

// mark marks the options of every keyed method of the files to generate
// with markName in their openapiv2_operation option, merged with the
// option the method may already have.
func mark(req *pluginpb.CodeGeneratorRequest) error {
	files, err := protodesc.NewFiles(&descriptorpb.FileDescriptorSet{File: req.GetProtoFile()})
	if err != nil {
		return fmt.Errorf("reading the request's files: %w", err)
	}
	types := dynamicpb.NewTypes(files)
	method, err := types.FindExtensionByName(methodOption)
	if err != nil {
		return nil // no file imports idem's options: nothing is keyed
	}
	field, _ := types.FindExtensionByName(fieldOption) // declared beside method
	generate := map[string]bool{}
	for _, name := range req.GetFileToGenerate() {
		generate[name] = true
	}
	for _, fdp := range req.GetProtoFile() {
		if !generate[fdp.GetName()] {
			continue
		}
		fd, err := files.FindFileByPath(fdp.GetName())
		if err != nil {
			return err
		}
		for i, sdp := range fdp.GetService() {
			for j, mdp := range sdp.GetMethod() {
				md := fd.Services().Get(i).Methods().Get(j)
				k, ok, err := keyedMethod(md, mdp.GetOptions(), method, field, types)
				if err != nil {
					return fmt.Errorf("%s: %w", md.FullName(), err)
				}
				if !ok {
					continue
				}
				if err := markMethod(mdp, k); err != nil {
					return fmt.Errorf("%s: %w", md.FullName(), err)
				}
			}
		}
	}
	return nil
}

// keyedMethod reports whether md, whose options are opts, is keyed, and how.
func keyedMethod(md protoreflect.MethodDescriptor, opts *descriptorpb.MethodOptions, method, field protoreflect.ExtensionType, types *dynamicpb.Types) (keyed, bool, error) {
	if opts == nil || md.IsStreamingClient() || md.IsStreamingServer() {
		return keyed{}, false, nil // idem refuses keys on streams
	}
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_IDEMPOTENT, descriptorpb.MethodOptions_NO_SIDE_EFFECTS:
		return keyed{}, false, nil
	}
	policy, err := extension(opts, method, types)
	if err != nil || policy == nil {
		return keyed{}, false, err
	}
	fields := policy.Descriptor().Fields()
	k := keyed{Required: policy.Get(fields.ByName("key_required")).Bool()}
	mode := policy.Get(fields.ByName("mode")).Enum()
	if v := fields.ByName("mode").Enum().Values().ByNumber(mode); v != nil && v.Name() == leasedMode {
		k.Leased = true
	}
	if field == nil {
		return k, true, nil
	}
	in := md.Input().Fields()
	for i := range in.Len() {
		fd := in.Get(i)
		if fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
			continue
		}
		fo, _ := fd.Options().(*descriptorpb.FieldOptions)
		p, err := extension(fo, field, types)
		if err != nil {
			return keyed{}, false, fmt.Errorf("field %s: %w", fd.Name(), err)
		}
		if p != nil && p.Get(p.Descriptor().Fields().ByName("key")).Bool() {
			k.Field = string(fd.Name())
			if fd.JSONName() != string(fd.Name()) {
				k.Field += " (JSON " + fd.JSONName() + ")"
			}
			break
		}
	}
	return k, true, nil
}

// extension returns the value of the extension xt in opts, read again with
// types, or nil when opts does not set it.
func extension(opts proto.Message, xt protoreflect.ExtensionType, types *dynamicpb.Types) (protoreflect.Message, error) {
	if opts == nil || !opts.ProtoReflect().IsValid() {
		return nil, nil
	}
	b, err := proto.Marshal(opts)
	if err != nil {
		return nil, err
	}
	m := opts.ProtoReflect().New().Interface()
	if err := (proto.UnmarshalOptions{Resolver: types}).Unmarshal(b, m); err != nil {
		return nil, err
	}
	xd := xt.TypeDescriptor()
	if !m.ProtoReflect().Has(xd) {
		return nil, nil
	}
	return m.ProtoReflect().Get(xd).Message(), nil
}

// markMethod adds the mark of k to the openapiv2_operation option of mdp.
func markMethod(mdp *descriptorpb.MethodDescriptorProto, k keyed) error {
	value, err := structpb.NewValue(map[string]any{"required": k.Required, "field": k.Field, "leased": k.Leased})
	if err != nil {
		return err
	}
	op, _ := proto.GetExtension(mdp.GetOptions(), options.E_Openapiv2Operation).(*options.Operation)
	if op == nil {
		op = &options.Operation{}
	}
	exts := op.GetExtensions()
	if exts == nil {
		exts = map[string]*structpb.Value{}
	}
	exts[markName] = value
	op.SetExtensions(exts)
	proto.SetExtension(mdp.GetOptions(), options.E_Openapiv2Operation, op)
	return nil
}
