package interceptor

import (
	"fmt"
	"strings"
)

// HTTP header names of idem, for transports that speak HTTP (Connect, a
// grpc-gateway), as draft-ietf-httpapi-idempotency-key-header names them.
const (
	// HTTPKeyHeader carries the idempotency key of an HTTP request.
	HTTPKeyHeader = "Idempotency-Key"
	// HTTPReplayedHeader is set to "true" on a replayed response.
	HTTPReplayedHeader = "Idempotent-Replayed"
)

// ParseHTTPKey returns the idempotency key an Idempotency-Key header value
// carries. The IETF draft makes the value a Structured Field String (RFC
// 8941), a quoted string such as "8e03978e-40d5-43e8-bc93-6894a57f9324";
// ParseHTTPKey also takes the bare token form many clients send
// (8e03978e-40d5-43e8-bc93-6894a57f9324). Either way the key must then
// pass [ValidateKey]. The error names what is wrong with the value.
func ParseHTTPKey(value string) (string, error) {
	v := strings.Trim(value, " \t") // optional whitespace of HTTP
	if !strings.HasPrefix(v, `"`) {
		if strings.Contains(v, `"`) {
			return "", fmt.Errorf("a quoted key must start and end with a double quote")
		}
		return v, ValidateKey(v)
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("a quoted key may escape only a double quote or a backslash")
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("the quoted key has more after its closing quote")
			}
			key := b.String()
			return key, ValidateKey(key)
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("a quoted key must be visible ASCII, got byte 0x%02x", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("the quoted key has no closing double quote")
}

// FormatHTTPKey returns key as an Idempotency-Key header value: a
// Structured Field String, as the IETF draft writes it.
func FormatHTTPKey(key string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}
