package idem

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	idemv1 "github.com/idemkit/idem/gen/idem/v1"
)

// method is the idempotency policy of one RPC, read once from its
// descriptor.
type method struct {
	// found: the method is in the registry.
	found bool
	// exempt methods are safe to retry as they are (idempotency_level
	// IDEMPOTENT or NO_SIDE_EFFECTS) and bypass idem.
	exempt bool
	// required rejects calls without a key.
	required bool
	// output is the response type, needed to replay without the handler;
	// nil when the method is not in the protobuf registry.
	output protoreflect.MessageType
	// raw responses go to gRPC as their recorded bytes, carried as the
	// unknown fields of an empty message: re-encoding a decoded response of
	// this type could reorder map entries or extensions.
	raw bool

	// mode is how the method's keys are held: ModeLeased holds them with
	// a lease of length lease instead of a transaction; ModeOptimistic
	// reads them only when recording, ModeAuto likewise for the calls
	// marked as first attempts (see attemptOf); ModeAtomic reads them
	// first. Never empty once looked up.
	mode  Mode
	lease time.Duration
	// loader rebuilds responses too large to record; rerun allows running
	// the handler again instead.
	loader Loader
	rerun  bool

	// ttl is how long the method's keys are kept; zero is the store's
	// default. scope names its keys; empty is the full method name.
	ttl   time.Duration
	scope string
	// keyField is the string field of the request that carries the call's
	// key when the metadata does not; nil when none is marked.
	keyField protoreflect.FieldDescriptor
	// streaming methods are refused keys.
	streaming bool
	// finish keeps a leased call's request for a Finisher, with the
	// request metadata finishHeaders names (lower-case).
	finish        bool
	finishHeaders []string
	// keepRequest records the request with the outcome.
	keepRequest bool
}

// defaultMode is the mode of a method whose policy names none.
const defaultMode = ModeAtomic

// protoModes are the modes of the option's values; MODE_UNSPECIFIED, and a
// value this version does not know, are the default.
var protoModes = map[idemv1.Mode]Mode{
	idemv1.Mode_MODE_ATOMIC:     ModeAtomic,
	idemv1.Mode_MODE_LEASED:     ModeLeased,
	idemv1.Mode_MODE_OPTIMISTIC: ModeOptimistic,
	idemv1.Mode_MODE_AUTO:       ModeAuto,
}

// methods caches policies by full method name.
type methods struct {
	files *protoregistry.Files
	types *protoregistry.Types
	opts  *options // per-method policies, which replace the descriptor's
	cache sync.Map // string -> *method
}

// newMethods returns a cache of the policies of the methods in the global
// protobuf registry, with the per-method options of o (nil: none).
func newMethods(o *options) *methods {
	if o == nil {
		o = evaluateOptions(nil) // a client's: the descriptors alone
	}
	return &methods{files: protoregistry.GlobalFiles, types: protoregistry.GlobalTypes, opts: o}
}

func (ms *methods) lookup(fullMethod string) *method {
	if m, ok := ms.cache.Load(fullMethod); ok {
		return m.(*method)
	}
	m := ms.resolve(fullMethod)
	if p, ok := ms.opts.policies[fullMethod]; ok {
		m.setPolicy(p)
	}
	if m.lease <= 0 {
		m.lease = defaultLease
	}
	if m.mode == "" {
		m.mode = defaultMode
	}
	actual, _ := ms.cache.LoadOrStore(fullMethod, m)
	return actual.(*method)
}

// setPolicy sets m's policy to p, in place of its descriptor's.
func (m *method) setPolicy(p MethodPolicy) {
	m.required = p.KeyRequired
	m.mode = p.Mode
	m.lease = p.Lease
	m.ttl = p.TTL
	m.scope = p.Scope
	m.finish = p.Finish
	m.finishHeaders = p.FinishHeaders
	m.rerun = p.RerunWhenNotCached
	m.loader = p.Loader
	m.keepRequest = p.KeepRequest
}

// findMethod returns the descriptor of fullMethod ("/pkg.Service/Method")
// in files.
func findMethod(files *protoregistry.Files, fullMethod string) (protoreflect.MethodDescriptor, error) {
	name := protoreflect.FullName(strings.Replace(strings.TrimPrefix(fullMethod, "/"), "/", ".", 1))
	d, err := files.FindDescriptorByName(name)
	if err != nil {
		return nil, err
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is not a method", name)
	}
	return md, nil
}

// check returns an error naming every method a [WithMethodPolicy] names
// that is not a unary method of a service in the protobuf registry (a
// misspelt name would otherwise leave its method without the policy meant
// for it, silently), and every value of a policy that no field takes.
func (ms *methods) check() error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(ms.opts.policies)) {
		p := ms.opts.policies[name]
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("idem: WithMethodPolicy(%q): "+format, append([]any{name}, args...)...))
		}
		m := ms.resolve(name)
		switch {
		case !m.found:
			bad("not a method of a service in the protobuf registry (want \"/pkg.Service/Method\", and the service's generated package imported)")
		case m.streaming:
			bad("the method streams; idem keys unary methods")
		}
		switch p.Mode {
		case "", ModeAtomic, ModeLeased, ModeOptimistic, ModeAuto:
		default:
			bad("Mode %q is not one of idem's modes (%s, %s, %s, %s)", p.Mode, ModeAtomic, ModeLeased, ModeOptimistic, ModeAuto)
		}
		if p.Lease < 0 {
			bad("Lease %v is negative (zero means the default, 60 s)", p.Lease)
		}
		if p.TTL < 0 {
			bad("TTL %v is negative (zero means the store's default)", p.TTL)
		}
		if p.Mode != ModeLeased {
			mode := string(p.Mode)
			if mode == "" {
				mode = "unset (" + string(defaultMode) + ")"
			}
			if p.Lease != 0 {
				bad("Lease is set, but Mode is %s: only %s mode holds a key for a lease", mode, ModeLeased)
			}
			if p.Finish {
				bad("Finish is set, but Mode is %s: a Finisher finishes only calls in %s mode", mode, ModeLeased)
			}
		}
		if len(p.FinishHeaders) > 0 && !p.Finish {
			bad("FinishHeaders is set without Finish: nothing keeps the headers for a Finisher")
		}
	}
	return errors.Join(errs...)
}

// resolve reads the policy of "/pkg.Service/Method" from the registry. A
// method the registry does not know takes a key when the client sends one.
func (ms *methods) resolve(fullMethod string) *method {
	md, err := findMethod(ms.files, fullMethod)
	if err != nil {
		return &method{}
	}
	m := &method{found: true}
	if opts, ok := md.Options().(*descriptorpb.MethodOptions); ok && opts != nil {
		switch opts.GetIdempotencyLevel() {
		case descriptorpb.MethodOptions_IDEMPOTENT, descriptorpb.MethodOptions_NO_SIDE_EFFECTS:
			m.exempt = true
		}
		if p, ok := proto.GetExtension(opts, idemv1.E_Method).(*idemv1.MethodPolicy); ok {
			m.required = p.GetKeyRequired()
			m.mode = protoModes[p.GetMode()] // "" when unset: the default
			m.lease = p.GetLease().AsDuration()
			m.rerun = p.GetRerunWhenNotCached()
			m.ttl = p.GetTtl().AsDuration()
			m.scope = p.GetScope()
			m.finish = p.GetFinish()
			for _, k := range p.GetFinishHeaders() {
				m.finishHeaders = append(m.finishHeaders, strings.ToLower(k))
			}
		}
	}
	m.streaming = md.IsStreamingClient() || md.IsStreamingServer()
	fields := md.Input().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if p, ok := proto.GetExtension(fd.Options(), idemv1.E_Field).(*idemv1.FieldPolicy); ok && p.GetKey() &&
			fd.Kind() == protoreflect.StringKind && fd.Cardinality() != protoreflect.Repeated {
			m.keyField = fd
			break
		}
	}
	if mt, err := ms.types.FindMessageByName(md.Output().FullName()); err == nil {
		m.output = mt
		// A message with required fields cannot be encoded empty.
		m.raw = !canonical(md.Output(), map[protoreflect.FullName]bool{}) &&
			md.Output().RequiredNumbers().Len() == 0
	}
	return m
}

// canonical reports whether every message of type md encodes to the same
// bytes however it was built: protobuf orders known fields by number, but
// leaves the order of map entries and extensions unspecified.
func canonical(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return true
	}
	seen[md.FullName()] = true
	if md.ExtensionRanges().Len() > 0 {
		return false
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() {
			return false
		}
		if fd.Message() != nil && !canonical(fd.Message(), seen) {
			return false
		}
	}
	return true
}
