package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/store"
)

func TestStepValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    store.Step
		rule string // in the error; empty when p is valid
	}{
		{"one byte", store.Step{Name: "a"}, ""},
		{"255 bytes", store.Step{Name: strings.Repeat("a", store.MaxStepLength)}, ""},
		{"255 bytes of two-byte runes and one", store.Step{Name: strings.Repeat("é", 127) + "a"}, ""},
		{"non-ASCII letters and symbols", store.Step{Name: "étape ✓ 步骤"}, ""},
		{"64 KiB of data", store.Step{Name: "a", Result: make([]byte, store.MaxStepResultBytes)}, ""},
		{"empty", store.Step{Result: []byte("d")}, "empty"},
		{"256 bytes", store.Step{Name: strings.Repeat("a", store.MaxStepLength+1)}, "256 bytes, more than 255"},
		{"NUL", store.Step{Name: "a\x00b"}, "control character U+0000 at byte 1"},
		{"tab", store.Step{Name: "a\tb"}, "control character U+0009"},
		{"unit separator", store.Step{Name: "a\x1f"}, "control character U+001F"},
		{"DEL", store.Step{Name: "a\x7f"}, "control character U+007F"},
		{"0xff", store.Step{Name: "a\xffb"}, "not valid UTF-8"},
		{"truncated rune", store.Step{Name: "\xc3"}, "not valid UTF-8"},
		{"64 KiB + 1 of data", store.Step{Name: "a", Result: make([]byte, store.MaxStepResultBytes+1)}, "65537 bytes, more than 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			switch {
			case tc.rule == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.rule == "":
			case !errors.Is(err, store.ErrInvalidStep):
				t.Fatalf("Validate: %v, want ErrInvalidStep", err)
			case !strings.Contains(err.Error(), tc.rule):
				t.Fatalf("Validate: %q, want it to name the rule (%q)", err, tc.rule)
			}
		})
	}
}

func TestScopeValidate(t *testing.T) {
	valid := store.Scope{Tenant: "acme", Method: "/pkg.Service/Method", Key: "k"}
	with := func(f func(k *store.Scope)) store.Scope {
		k := valid
		f(&k)
		return k
	}
	for _, c := range []struct {
		name string
		key  store.Scope
		// field is the field the error must name; "" for a valid key.
		field string
	}{
		{"valid", valid, ""},
		{"empty tenant", with(func(k *store.Scope) { k.Tenant = "" }), ""},
		{"tenant at its bound", with(func(k *store.Scope) { k.Tenant = strings.Repeat("t", store.MaxTenantLength) }), ""},
		{"non-ASCII tenant", with(func(k *store.Scope) { k.Tenant = "Zürich-東京" }), ""},
		{"method at its bound", with(func(k *store.Scope) { k.Method = "/" + strings.Repeat("m", store.MaxMethodLength-1) }), ""},
		{"key at its bound", with(func(k *store.Scope) { k.Key = strings.Repeat("k", store.MaxKeyLength) }), ""},
		{"all at their bounds", store.Scope{
			Tenant: strings.Repeat("t", store.MaxTenantLength),
			Method: strings.Repeat("m", store.MaxMethodLength),
			Key:    strings.Repeat("k", store.MaxKeyLength),
		}, ""},

		{"tenant past its bound", with(func(k *store.Scope) { k.Tenant = strings.Repeat("t", store.MaxTenantLength+1) }), "tenant"},
		{"10 KB tenant", with(func(k *store.Scope) { k.Tenant = strings.Repeat("t", 10<<10) }), "tenant"},
		{"tenant not UTF-8", with(func(k *store.Scope) { k.Tenant = "bad-\xff\xfe" }), "tenant"},
		{"tenant with NUL", with(func(k *store.Scope) { k.Tenant = "a\x00b" }), "tenant"},
		{"empty method", with(func(k *store.Scope) { k.Method = "" }), "method"},
		{"method past its bound", with(func(k *store.Scope) { k.Method = strings.Repeat("m", store.MaxMethodLength+1) }), "method"},
		{"method not UTF-8", with(func(k *store.Scope) { k.Method = "/pkg.S/\xc3" }), "method"},
		{"method with NUL", with(func(k *store.Scope) { k.Method = "/pkg.S/M\x00" }), "method"},
		{"empty key", with(func(k *store.Scope) { k.Key = "" }), "key"},
		{"key past its bound", with(func(k *store.Scope) { k.Key = strings.Repeat("k", store.MaxKeyLength+1) }), "key"},
		{"key not UTF-8", with(func(k *store.Scope) { k.Key = "caf\xe9" }), "key"},
		{"key with NUL", with(func(k *store.Scope) { k.Key = "\x00" }), "key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.key.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, store.ErrInvalidScope) {
				t.Fatalf("Validate() = %v, want an error wrapping ErrInvalidScope", err)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Errorf("Validate() = %q, does not name the field %s", err, c.field)
			}
			if len(err.Error()) > 200 {
				t.Errorf("Validate() = %d bytes of text; it must not echo the value", len(err.Error()))
			}
		})
	}
}

func TestKeyFilterValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		f    store.KeyFilter
		// rule is what the error must say; "" for a valid filter.
		rule string
	}{
		{"zero", store.KeyFilter{}, ""},
		{"every field", store.KeyFilter{Tenant: "Zürich", Method: "/pkg.Service/Method", Limit: 5000,
			States: []store.State{store.InProgress, store.Abandoned, store.Recorded, store.Expired}}, ""},
		{"tenant and method at their bounds", store.KeyFilter{Tenant: strings.Repeat("t", store.MaxTenantLength), Method: strings.Repeat("m", store.MaxMethodLength)}, ""},
		{"a tenant AllTenants ignores", store.KeyFilter{AllTenants: true, Tenant: "a\x00b"}, ""},

		{"tenant with NUL", store.KeyFilter{Tenant: "a\x00b"}, "tenant filter contains a NUL byte"},
		{"tenant not UTF-8", store.KeyFilter{Tenant: "bad-\xff"}, "tenant filter is not valid UTF-8"},
		{"tenant past its bound", store.KeyFilter{Tenant: strings.Repeat("t", store.MaxTenantLength+1)}, "tenant filter is 256 bytes, longer than the 255 allowed"},
		{"method with NUL", store.KeyFilter{AllTenants: true, Method: "/a\x00b"}, "method filter contains a NUL byte"},
		{"method not UTF-8", store.KeyFilter{Method: "/pkg.S/\xc3"}, "method filter is not valid UTF-8"},
		{"method past its bound", store.KeyFilter{Method: strings.Repeat("m", 10<<10)}, "method filter is 10240 bytes, longer than the 1024 allowed"},
		{"unknown state", store.KeyFilter{States: []store.State{store.Recorded, "done"}}, "states filter [1] is not a key state"},
		{"empty state", store.KeyFilter{States: []store.State{""}}, "states filter [0] is not a key state"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.f.Validate()
			switch {
			case c.rule == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case c.rule == "":
			case !errors.Is(err, store.ErrInvalidScope):
				t.Fatalf("Validate() = %v, want an error wrapping ErrInvalidScope", err)
			case !strings.Contains(err.Error(), c.rule):
				t.Errorf("Validate() = %q, want it to name the rule (%q)", err, c.rule)
			}
		})
	}
}
