package idemv1_test

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	idemv1 "github.com/idemkit/idem/gen/idem/v1"
	_ "github.com/idemkit/idem/internal/gen/idem/test/v1" // a service with idem's options
)

// The options are read from a method's descriptor, as the interceptor reads
// them: here CreatePayment of idem's own test service, declared with
// option (idem.v1.method).key_required = true.
func Example() {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName("idem.test.v1.PaymentService.CreatePayment")
	if err != nil {
		panic(err)
	}
	opts := d.(protoreflect.MethodDescriptor).Options().(*descriptorpb.MethodOptions)
	policy := proto.GetExtension(opts, idemv1.E_Method).(*idemv1.MethodPolicy)
	fmt.Println("key required:", policy.GetKeyRequired())
	// Output: key required: true
}
