package interceptor_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store/memory"
)

// nopLoader is a Loader that is never called.
type nopLoader struct{}

func (nopLoader) Reference(context.Context, proto.Message) ([]byte, error) { return nil, nil }
func (nopLoader) Load(context.Context, []byte) (proto.Message, error)      { return nil, nil }

// TestNewRefusesMethodsItCannotKey: an option that names a method the
// protobuf registry does not know (a misspelt name), or a streaming method,
// fails idem.New with an error naming the option and the method, rather
// than being ignored; a unary method of a registered service is accepted.
func TestNewRefusesMethodsItCannotKey(t *testing.T) {
	const unknown = "/nope.v1.S/M"
	watch := testv1.TestService_Watch_FullMethodName
	for _, c := range []struct {
		name   string
		opt    idem.Option
		want   []string // in the error
		refuse bool
	}{
		{"unknown, WithLeased", idem.WithLeased(0, unknown), []string{"WithLeased", unknown, "not a method"}, true},
		{"unknown, WithOptimistic", idem.WithOptimistic(unknown), []string{"WithOptimistic", unknown, "not a method"}, true},
		{"streaming, WithOptimistic", idem.WithOptimistic(watch), []string{"WithOptimistic", watch, "streams"}, true},
		{"unknown, WithLoader", idem.WithLoader(unknown, nopLoader{}), []string{"WithLoader", unknown}, true},
		{"unknown, WithRerunWhenNotCached", idem.WithRerunWhenNotCached(unknown), []string{"WithRerunWhenNotCached", unknown}, true},
		{"unknown, WithFinish", idem.WithFinish(unknown), []string{"WithFinish", unknown}, true},
		{"streaming, WithLeased", idem.WithLeased(0, watch), []string{"WithLeased", watch, "streams"}, true},
		{"streaming, WithFinish", idem.WithFinish(watch), []string{"WithFinish", watch, "streams"}, true},
		{"unary", idem.WithLeased(0, doMethod), nil, false},
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
	_, err := idem.New(memory.New(), idem.WithLeased(0, unknown, watch, doMethod))
	if err == nil || !strings.Contains(err.Error(), unknown) || !strings.Contains(err.Error(), watch) || strings.Contains(err.Error(), doMethod) {
		t.Errorf("New's error %v, want one that names %s and %s, not %s", err, unknown, watch, doMethod)
	}
}
