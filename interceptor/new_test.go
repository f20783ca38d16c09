package interceptor_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
)

// TestNewRefusesMethodsItCannotKey: a policy that names a method the
// protobuf registry does not know (a misspelt name), or a streaming
// method, or that holds a value no field takes, fails idem.New with an
// error naming the option, the method and what is wrong, rather than being
// ignored; a policy of a unary method of a registered service is accepted.
func TestNewRefusesMethodsItCannotKey(t *testing.T) {
	const unknown = "/nope.v1.S/M"
	watch := testv1.TestService_Watch_FullMethodName
	leased := idem.MethodPolicy{Mode: idem.ModeLeased}
	for _, c := range []struct {
		name   string
		opt    idem.Option
		want   []string // in the error
		refuse bool
	}{
		{"unknown", idem.WithMethodPolicy(unknown, leased), []string{"WithMethodPolicy", unknown, "not a method"}, true},
		{"streaming", idem.WithMethodPolicy(watch, leased), []string{"WithMethodPolicy", watch, "streams"}, true},
		{"unknown mode", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{Mode: "LEASED"}), []string{"WithMethodPolicy", doMethod, `Mode "LEASED"`}, true},
		{"negative lease", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{Mode: idem.ModeLeased, Lease: -time.Second}), []string{doMethod, "Lease -1s is negative"}, true},
		{"negative TTL", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{TTL: -time.Second}), []string{doMethod, "TTL -1s is negative"}, true},
		{"lease, not leased", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{Mode: idem.ModeAuto, Lease: time.Minute}), []string{doMethod, "Lease is set", "Mode is auto:"}, true},
		{"lease, default mode", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{Lease: time.Minute}), []string{doMethod, "Lease is set", "Mode is unset (atomic):"}, true},
		{"finish, not leased", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{Mode: idem.ModeOptimistic, Finish: true}), []string{doMethod, "Finish is set", "Mode is optimistic:"}, true},
		{"finish headers, no finish", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{Mode: idem.ModeLeased, FinishHeaders: []string{"x-user"}}), []string{doMethod, "FinishHeaders is set without Finish"}, true},
		{"leased, finished", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{Mode: idem.ModeLeased, Lease: time.Minute, Finish: true, FinishHeaders: []string{"x-user"}}), nil, false},
		{"unary", idem.WithMethodPolicy(doMethod, leased), nil, false},
		{"zero", idem.WithMethodPolicy(doMethod, idem.MethodPolicy{}), nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := idem.New(memory.New(), c.opt)
			if !c.refuse {
				if err != nil || e == nil {
					t.Fatalf("New = %v, %v; want an engine", e, err)
				}
				return
			}
			if err == nil || e != nil {
				t.Fatalf("New = %v, %v; want an error", e, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New's error %q does not say %q", err, w)
				}
			}
		})
	}

	// Every method at fault is named, in one error.
	_, err := idem.New(memory.New(), idem.WithMethodPolicy(unknown, leased), idem.WithMethodPolicy(watch, leased), idem.WithMethodPolicy(doMethod, leased))
	if err == nil || !strings.Contains(err.Error(), unknown) || !strings.Contains(err.Error(), watch) || strings.Contains(err.Error(), doMethod) {
		t.Errorf("New's error %v, want one that names %s and %s, not %s", err, unknown, watch, doMethod)
	}
}
