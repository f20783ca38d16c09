package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/store"
)

func TestRecoveryPointValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    store.RecoveryPoint
		rule string // in the error; empty when p is valid
	}{
		{"one byte", store.RecoveryPoint{Step: "a"}, ""},
		{"255 bytes", store.RecoveryPoint{Step: strings.Repeat("a", store.MaxStepLength)}, ""},
		{"255 bytes of two-byte runes and one", store.RecoveryPoint{Step: strings.Repeat("é", 127) + "a"}, ""},
		{"non-ASCII letters and symbols", store.RecoveryPoint{Step: "étape ✓ 步骤"}, ""},
		{"64 KiB of data", store.RecoveryPoint{Step: "a", Data: make([]byte, store.MaxRecoveryDataBytes)}, ""},
		{"empty", store.RecoveryPoint{Data: []byte("d")}, "empty"},
		{"256 bytes", store.RecoveryPoint{Step: strings.Repeat("a", store.MaxStepLength+1)}, "256 bytes, more than 255"},
		{"NUL", store.RecoveryPoint{Step: "a\x00b"}, "control character U+0000 at byte 1"},
		{"tab", store.RecoveryPoint{Step: "a\tb"}, "control character U+0009"},
		{"unit separator", store.RecoveryPoint{Step: "a\x1f"}, "control character U+001F"},
		{"DEL", store.RecoveryPoint{Step: "a\x7f"}, "control character U+007F"},
		{"0xff", store.RecoveryPoint{Step: "a\xffb"}, "not valid UTF-8"},
		{"truncated rune", store.RecoveryPoint{Step: "\xc3"}, "not valid UTF-8"},
		{"64 KiB + 1 of data", store.RecoveryPoint{Step: "a", Data: make([]byte, store.MaxRecoveryDataBytes+1)}, "65537 bytes, more than 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			switch {
			case tc.rule == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.rule == "":
			case !errors.Is(err, store.ErrInvalidRecoveryPoint):
				t.Fatalf("Validate: %v, want ErrInvalidRecoveryPoint", err)
			case !strings.Contains(err.Error(), tc.rule):
				t.Fatalf("Validate: %q, want it to name the rule (%q)", err, tc.rule)
			}
		})
	}
}
