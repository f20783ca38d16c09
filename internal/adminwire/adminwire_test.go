package adminwire

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// TestMetadata maps HTTP headers as gRPC metadata carries them: lower-case
// names, -bin values decoded, padded or not, an undecodable one kept.
func TestMetadata(t *testing.T) {
	h := http.Header{}
	h.Add("Authorization", "Bearer t")
	h.Add("X-Trace-Bin", "AP+A") // padded or not: 3 bytes need none
	h.Add("X-Trace-Bin", "AP8")  // unpadded
	h.Add("X-Trace-Bin", "AP8=") // padded
	h.Add("X-Other-Bin", "not base64!")
	md := Metadata(h)
	for name, want := range map[string][]string{
		"authorization": {"Bearer t"},
		"x-trace-bin":   {"\x00\xff\x80", "\x00\xff", "\x00\xff"},
		"x-other-bin":   {"not base64!"},
	} {
		if !slices.Equal(md[name], want) {
			t.Errorf("%s: %q, want %q", name, md[name], want)
		}
	}
	if len(md) != 3 {
		t.Errorf("metadata %q, want 3 names", md)
	}

	r := httptest.NewRequest(http.MethodGet, "https://127.0.0.1/console/", nil)
	r.Header.Set("Authorization", "Bearer t")
	c := HTTPCaller(r)
	if c.TLS != r.TLS || c.TLS == nil || c.Header["authorization"][0] != "Bearer t" || c.Peer != r.RemoteAddr || c.Peer == "" {
		t.Errorf("HTTPCaller: %+v", c)
	}
}
