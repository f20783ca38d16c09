package admin

import (
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	idemv1 "github.com/idemkit/idem/gen/idem/v1"
	"github.com/idemkit/idem/internal/record"
	"github.com/idemkit/idem/store"
)

// methods finds the descriptor of the method a key's Method names, and
// remembers what it found (nothing included): the registry only grows
// while packages initialize, before a Server exists.
type methods struct {
	mu    sync.Mutex
	found map[string]protoreflect.MethodDescriptor
}

// find returns the method that name, a key's Method, names: a full method
// name "/pkg.Service/Method", or the (idem.v1.method).scope of one. It
// returns nil when the registry holds no such method.
func (ms *methods) find(name string) protoreflect.MethodDescriptor {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if md, ok := ms.found[name]; ok {
		return md
	}
	if ms.found == nil {
		ms.found = map[string]protoreflect.MethodDescriptor{}
	}
	md := findMethod(name)
	ms.found[name] = md
	return md
}

func findMethod(name string) protoreflect.MethodDescriptor {
	// A scope, when set, replaces the full name in keys: look for it first.
	var byScope protoreflect.MethodDescriptor
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		svcs := fd.Services()
		for i := range svcs.Len() {
			ms := svcs.Get(i).Methods()
			for j := range ms.Len() {
				md := ms.Get(j)
				p, _ := proto.GetExtension(md.Options(), idemv1.E_Method).(*idemv1.MethodPolicy)
				if p.GetScope() == name {
					byScope = md
					return false
				}
			}
		}
		return true
	})
	if byScope != nil {
		return byScope
	}
	full := protoreflect.FullName(strings.Replace(strings.TrimPrefix(name, "/"), "/", ".", 1))
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(full)
	if err != nil || !strings.HasPrefix(name, "/") {
		return nil
	}
	md, _ := d.(protoreflect.MethodDescriptor)
	return md
}

// The notes of an outcome returned raw.
const (
	noteNotCached  = "the response was too large to record; raw_response is the reference the method's loader rebuilds it from"
	noteUnknown    = "the server does not know the method's response type (its generated Go package is not linked into the server); raw_response is the response as recorded"
	noteUnreadable = "the recorded outcome cannot be read (the server's log says why); raw_response is the outcome as stored"
)

// outcome returns o, recorded under method, as the service shows it, and
// the error that kept it from being decoded, for the log.
func (s *Server) outcome(method string, o *store.Outcome) (*adminv1.Outcome, error) {
	out := &adminv1.Outcome{Code: int32(o.Code), NotCached: o.NotCached}
	md := s.methods.find(method)
	if md != nil {
		out.ResponseType = string(md.Output().FullName())
	}
	if o.NotCached {
		out.Result = &adminv1.Outcome_RawResponse{RawResponse: o.Body}
		out.Note = noteNotCached
		return out, nil
	}
	raw := func(b []byte, note string) {
		out.Result = &adminv1.Outcome_RawResponse{RawResponse: b}
		out.Note = note
	}
	rec, err := record.Decode(o.Body)
	if err != nil {
		raw(o.Body, noteUnreadable)
		return out, err
	}
	c := rec.Code
	if rec.Bare {
		c = o.Code
	}
	out.Code = int32(c)
	if c != code.Code_OK {
		st := &spb.Status{}
		if err := proto.Unmarshal(rec.Payload, st); err != nil {
			raw(rec.Payload, noteUnreadable)
			return out, err
		}
		out.Result = &adminv1.Outcome_Error{Error: st}
		return out, nil
	}
	if md == nil {
		raw(rec.Payload, noteUnknown)
		return out, nil
	}
	v, err := decodeJSON(md.Output(), rec.Payload)
	if err != nil {
		raw(rec.Payload, noteUnreadable)
		return out, err
	}
	out.Result = &adminv1.Outcome_Response{Response: v}
	return out, nil
}

// decodeJSON decodes b as a message of type d, rendered as protobuf's JSON
// mapping: with the type's generated code when the server links it in,
// else from its descriptor.
func decodeJSON(d protoreflect.MessageDescriptor, b []byte) (*structpb.Value, error) {
	var msg proto.Message
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName()); err == nil {
		msg = mt.New().Interface()
	} else {
		msg = dynamicpb.NewMessage(d)
	}
	if err := proto.Unmarshal(b, msg); err != nil {
		return nil, err
	}
	js, err := protojson.Marshal(msg)
	if err != nil {
		return nil, err
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(js, v); err != nil {
		return nil, err
	}
	return v, nil
}

// The notes of a request returned raw.
const (
	noteRequestUnknown    = "the server does not know the method's request type (its generated Go package is not linked into the server); raw is the request as kept"
	noteRequestUnreadable = "the kept request cannot be decoded with the method's request type; raw is the request as kept"
)

// request returns the request ki keeps, as the service shows it: the one
// recorded with its outcome (idem.MethodPolicy.KeepRequest), else the one
// kept for a finisher; nil when it keeps none. The error is the one that
// kept it from being decoded, for the log.
func (s *Server) request(ki store.KeyInfo) (*adminv1.Request, error) {
	var (
		b      []byte
		method string
	)
	switch {
	case ki.Outcome != nil && !ki.Outcome.NotCached:
		rec, err := record.Decode(ki.Outcome.Body)
		if err != nil || len(rec.Request) == 0 {
			return nil, nil // an unreadable outcome is the outcome's to report
		}
		b, method = rec.Request, ki.Scope.Method
	case ki.Call != nil && len(ki.Call.Request) > 0:
		b, method = ki.Call.Request, ki.Call.Method
	default:
		return nil, nil
	}
	r := &adminv1.Request{}
	md := s.methods.find(method)
	if md == nil {
		r.Body, r.Note = &adminv1.Request_Raw{Raw: b}, noteRequestUnknown
		return r, nil
	}
	r.RequestType = string(md.Input().FullName())
	v, err := decodeJSON(md.Input(), b)
	if err != nil {
		r.Body, r.Note = &adminv1.Request_Raw{Raw: b}, noteRequestUnreadable
		return r, err
	}
	r.Body = &adminv1.Request_Decoded{Decoded: v}
	return r, nil
}
