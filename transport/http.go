package transport

import (
	"fmt"
	"strings"

	"github.com/dunglas/httpsfv"
)

// ParseHTTPKey returns the idempotency key an Idempotency-Key header value
// carries. The IETF draft makes the value a Structured Field String (RFC
// 8941), a quoted string such as "8e03978e-40d5-43e8-bc93-6894a57f9324",
// with no parameters; ParseHTTPKey also takes the bare form many clients
// send (8e03978e-40d5-43e8-bc93-6894a57f9324), which must be one HTTP
// token: letters, digits and !#$%&'*+-.^_`|~ (RFC 9110 tchar). A key with
// other characters (such as : / = or a space) must be quoted. Whitespace
// around the value is ignored. Either way the key must then pass
// [ValidateKey].
//
// A value that holds more than one key is refused, whatever its syntax:
// m1,m2 (as a proxy joins two Idempotency-Key header lines), "m1", "m2"
// (a list). So is a String with parameters ("m1";p=1). The error names what
// is wrong with the value.
func ParseHTTPKey(value string) (string, error) {
	v := strings.Trim(value, " \t") // optional whitespace of HTTP
	if !strings.HasPrefix(v, `"`) {
		return parseBareHTTPKey(v)
	}
	item, err := httpsfv.UnmarshalItem([]string{v})
	if err != nil {
		if l, lerr := httpsfv.UnmarshalList([]string{v}); lerr == nil && len(l) > 1 {
			return "", fmt.Errorf("holds more than one key, a list of %d values; send exactly one", len(l))
		}
		return "", fmt.Errorf("a quoted key must be one Structured Field String (RFC 8941): visible ASCII between double quotes, escaping only \\\" and \\\\, with nothing after the closing quote (%v)", err)
	}
	key, _ := item.Value.(string) // a value that starts with " is a String
	if names := item.Params.Names(); len(names) > 0 {
		return "", fmt.Errorf("a key takes no parameters, got ;%s", strings.Join(names, ";"))
	}
	return key, ValidateKey(key)
}

// parseBareHTTPKey returns the key of an unquoted Idempotency-Key value v:
// one token (RFC 9110). A comma, which separates the values of a header
// field, says that v holds more than one key. It is not httpsfv's: an RFC
// 8941 Token must start with a letter or *, and a UUID such as
// 8e03978e-40d5-43e8-bc93-6894a57f9324 starts with a digit.
func parseBareHTTPKey(v string) (string, error) {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case isTchar(c):
		case c == ',':
			return "", fmt.Errorf("holds more than one key, separated by ',' (as a proxy joins repeated header lines); send exactly one")
		case c == '"':
			return "", fmt.Errorf("a quoted key must start and end with a double quote")
		default:
			return "", fmt.Errorf("an unquoted key must be a token (letters, digits and !#$%%&'*+-.^_`|~), got %q at offset %d; quote the key to send other characters", c, i)
		}
	}
	return v, ValidateKey(v)
}

// isTchar reports whether c is a token character of RFC 9110 (tchar).
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// FormatHTTPKey returns key as an Idempotency-Key header value: a
// Structured Field String, as the IETF draft writes it, which
// [ParseHTTPKey] reads back as key. key should pass [ValidateKey]: one with
// a byte a String cannot hold (a control character, or one that is not
// ASCII) is returned quoted all the same, a value ParseHTTPKey refuses.
func FormatHTTPKey(key string) string {
	s, err := httpsfv.Marshal(httpsfv.NewItem(key))
	if err != nil {
		return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
	}
	return s
}
