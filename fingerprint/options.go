package fingerprint

import (
	"slices"

	"google.golang.org/protobuf/reflect/protoreflect"
)

var defaultOptions = &options{
	excluded: nil, // only fields marked with (idem.v1.field).fingerprint_exclude
}

type options struct {
	// excluded holds the full names of fields excluded in addition to the
	// ones marked in their .proto file.
	excluded map[protoreflect.FullName]struct{}
}

// Option configures a Hasher. Options are evaluated once, by NewHasher.
type Option func(*options)

func evaluateOptions(opts []Option) *options {
	optCopy := &options{}
	*optCopy = *defaultOptions
	optCopy.excluded = make(map[protoreflect.FullName]struct{}, len(defaultOptions.excluded))
	for name := range defaultOptions.excluded {
		optCopy.excluded[name] = struct{}{}
	}
	for _, o := range opts {
		o(optCopy)
	}
	return optCopy
}

// WithExcludedFields leaves the named fields out of the fingerprint, in
// addition to the fields marked with
//
//	[(idem.v1.field).fingerprint_exclude = true]
//
// which are always excluded. It is meant for messages whose .proto file the
// caller cannot annotate. A name is the field's full name, such as
// "payments.v1.CreatePaymentRequest.trace_id", and the field is excluded
// wherever its message appears in the request: at the top level, nested, as
// a list element or as a map value. Names that match no field have no effect.
//
// By default no fields are excluded besides the marked ones. Calling
// WithExcludedFields several times adds up.
func WithExcludedFields(names ...protoreflect.FullName) Option {
	names = slices.Clone(names)
	return func(o *options) {
		for _, name := range names {
			o.excluded[name] = struct{}{}
		}
	}
}
