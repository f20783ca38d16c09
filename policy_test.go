package idem

import (
	"slices"
	"testing"
	"time"

	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// TestPolicyFromDescriptor: a method's policy is its option
// (idem.v1.method), field by field, finish_headers matched lower-case.
func TestPolicyFromDescriptor(t *testing.T) {
	ms := newMethods(nil)
	m := ms.lookup(testv1.TestService_Finishable_FullMethodName)
	if !m.required || m.mode != ModeLeased || !m.finish || m.lease != defaultLease {
		t.Errorf("Finishable's policy: %+v; want a key required, leased for the default lease, finished", m)
	}
	if want := []string{"x-user"}; !slices.Equal(m.finishHeaders, want) {
		t.Errorf("Finishable's finish headers: %q, want %q", m.finishHeaders, want)
	}
	r := ms.lookup(testv1.TestService_Renamed_FullMethodName)
	if !r.required || r.scope != "idem.test.Do" || r.ttl != time.Second {
		t.Errorf("Renamed's policy: %+v; want a key required, scope idem.test.Do, a TTL of 1 s", r)
	}
}

// TestMethodPolicyReplacesTheDescriptors: WithMethodPolicy replaces the
// method's option wholesale: a zero field is its default, not the .proto
// file's value; idempotency_level still exempts.
func TestMethodPolicyReplacesTheDescriptors(t *testing.T) {
	ms := newMethods(evaluateOptions([]Option{
		WithMethodPolicy(testv1.TestService_Renamed_FullMethodName, MethodPolicy{}),
		WithMethodPolicy(testv1.TestService_Finishable_FullMethodName, MethodPolicy{
			Mode: ModeLeased, FinishHeaders: []string{"X-Trace-Bin"}, Finish: true, Lease: time.Minute,
		}),
		WithMethodPolicy(testv1.TestService_Do_FullMethodName, MethodPolicy{Mode: ModeOptimistic}),
		WithMethodPolicy(testv1.TestService_Read_FullMethodName, MethodPolicy{KeyRequired: true}),
	}))
	if err := ms.check(); err != nil {
		t.Fatal(err)
	}
	r := ms.lookup(testv1.TestService_Renamed_FullMethodName)
	if r.required || r.scope != "" || r.ttl != 0 || r.mode != ModeAtomic {
		t.Errorf("Renamed's policy: %+v; want every default, none of its .proto file's", r)
	}
	f := ms.lookup(testv1.TestService_Finishable_FullMethodName)
	if f.required || f.mode != ModeLeased || !f.finish || f.lease != time.Minute || !slices.Equal(f.finishHeaders, []string{"x-trace-bin"}) {
		t.Errorf("Finishable's policy: %+v; want leased for a minute, finished, no key required, header x-trace-bin only", f)
	}
	if d := ms.lookup(testv1.TestService_Do_FullMethodName); d.mode != ModeOptimistic || d.finish || d.finishHeaders != nil {
		t.Errorf("Do's policy: %+v; want optimistic, not finished", d)
	}
	if read := ms.lookup(testv1.TestService_Read_FullMethodName); !read.exempt {
		t.Errorf("Read's policy: %+v; want it exempt (NO_SIDE_EFFECTS), whatever its policy", read)
	}
}
