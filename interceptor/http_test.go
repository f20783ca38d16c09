package interceptor

import (
	"strings"
	"testing"
)

func TestParseHTTPKey(t *testing.T) {
	for _, c := range []struct {
		value, key string
		ok         bool
	}{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{` "order-1" `, "order-1", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{`""`, "", false},
		{``, "", false},
		{`"unterminated`, "", false},
		{`"a"b`, "", false},
		{`"a\nb"`, "", false},
		{`"a b"`, "", false}, // a space is valid in an sf-string, not in a key
		{`a"b`, "", false},
		{`"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255), true},
		{`"` + strings.Repeat("k", 256) + `"`, "", false},
		{"\"caf\xc3\xa9\"", "", false},
	} {
		key, err := ParseHTTPKey(c.value)
		if (err == nil) != c.ok || (c.ok && key != c.key) {
			t.Errorf("ParseHTTPKey(%q) = %q, %v; want %q, ok %v", c.value, key, err, c.key, c.ok)
		}
		if c.ok {
			if back, err := ParseHTTPKey(FormatHTTPKey(key)); err != nil || back != key {
				t.Errorf("FormatHTTPKey(%q) does not parse back: %q, %v", key, back, err)
			}
		}
	}
}
