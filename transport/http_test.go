package transport

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
		{"\t\"order-1\"\t", "order-1", true},
		{" order-1\t", "order-1", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{`"a,b"`, "a,b", true}, // a comma inside the string is the key's
		{`"order:1/2="`, "order:1/2=", true},
		{"!#$%&'*+-.^_`|~09azAZ", "!#$%&'*+-.^_`|~09azAZ", true}, // every kind of tchar
		{`""`, "", false},
		{``, "", false},
		{`   `, "", false},
		{`"unterminated`, "", false},
		{`"a"b`, "", false},
		{`"a\nb"`, "", false},
		{`"a\xb"`, "", false},
		{`"a b"`, "", false}, // a space is valid in an sf-string, not in a key
		{`a"b`, "", false},
		{`"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255), true},
		{`"` + strings.Repeat("k", 256) + `"`, "", false},
		{strings.Repeat("k", 256), "", false},
		{"\"caf\xc3\xa9\"", "", false},
		{"caf\xc3\xa9", "", false},
		// Two keys joined, as a proxy merges two header lines, or a list.
		{`m1-X,m2-X`, "", false},
		{`m1-X, m2-X`, "", false},
		{`"a","b"`, "", false},
		{`"a", "b"`, "", false},
		{`"a",b`, "", false},
		{`"a",`, "", false},
		// Parameters: the key is a bare String.
		{`"a";p=1`, "", false},
		{`"a";p`, "", false},
		{`a;p=1`, "", false},
		// Not tchar in the bare form: quote the key to send these.
		{`a b`, "", false},
		{`order:1`, "", false},
		{`a/b=`, "", false},
		{`(a)`, "", false},
		{"a\x00b", "", false},
		{"a\x7fb", "", false},
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

// TestParseHTTPKeySays: the error of a malformed value says what is wrong
// with it, for the client to read.
func TestParseHTTPKeySays(t *testing.T) {
	for _, c := range []struct{ value, says string }{
		{`m1-X,m2-X`, "more than one key"},
		{`"a","b"`, "more than one key"},
		{`"a";p=1`, "parameters"},
		{`a;p=1`, "';'"},
		{`order:1`, "token"},
		{`a"b`, "double quote"},
		{`"unterminated`, "Structured Field String"},
		{`"a b"`, "visible ASCII"},
		{``, "must not be empty"},
	} {
		if _, err := ParseHTTPKey(c.value); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("ParseHTTPKey(%q): %v; want an error saying %q", c.value, err, c.says)
		}
	}
}

func TestFormatHTTPKey(t *testing.T) {
	for key, want := range map[string]string{
		"order-1": `"order-1"`,
		`a"b\c`:   `"a\"b\\c"`,
		"a,b;c":   `"a,b;c"`,
	} {
		if got := FormatHTTPKey(key); got != want {
			t.Errorf("FormatHTTPKey(%q) = %s, want %s", key, got, want)
		}
	}
}

// tchars are the token characters of RFC 9110 (tchar).
const tchars = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// FuzzParseHTTPKey checks that every value ParseHTTPKey accepts names a key
// ValidateKey accepts, that a bare value it accepts is one HTTP token, and
// that every valid key survives FormatHTTPKey and ParseHTTPKey unchanged.
func FuzzParseHTTPKey(f *testing.F) {
	for _, v := range []string{`"order-1"`, `order-1`, `m1-X,m2-X`, `"a","b"`, `"a";p=1`, `"a\"b"`, ` "k" `} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		key, err := ParseHTTPKey(value)
		if err == nil {
			if verr := ValidateKey(key); verr != nil {
				t.Fatalf("ParseHTTPKey(%q) = %q, which ValidateKey refuses: %v", value, key, verr)
			}
			if v := strings.Trim(value, " \t"); !strings.HasPrefix(v, `"`) {
				for i := 0; i < len(v); i++ {
					if !strings.ContainsRune(tchars, rune(v[i])) {
						t.Fatalf("ParseHTTPKey(%q) took the bare key %q, with %q", value, key, v[i])
					}
				}
			}
		}
		if ValidateKey(value) == nil {
			if back, err := ParseHTTPKey(FormatHTTPKey(value)); err != nil || back != value {
				t.Fatalf("FormatHTTPKey(%q) = %s parses as %q, %v", value, FormatHTTPKey(value), back, err)
			}
		}
	})
}
