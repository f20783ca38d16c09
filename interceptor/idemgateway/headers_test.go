package idemgateway_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// idemHeaders returns the names of the headers of h that carry idem's
// response metadata, in any form: the HTTP names, and any Grpc-Metadata-
// name of an idem key.
func idemHeaders(h http.Header) []string {
	var names []string
	for name := range h {
		n := strings.ToLower(strings.TrimPrefix(name, "Grpc-Metadata-"))
		if strings.HasPrefix(n, "idempotency-") || strings.HasPrefix(n, "idempotent-") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// TestResponseHeaders: an HTTP client gets idem's response headers under
// the names Connect sends them with too, Idempotency-Key-Expires on the
// first answer and every replay, and Idempotent-Replayed on a replay, once
// each, and no Grpc-Metadata- copy of them; the handler's own metadata is
// still forwarded as grpc-gateway does.
func TestResponseHeaders(t *testing.T) {
	e := newEnv(t, config{})
	expires := http.CanonicalHeaderKey(idem.ExpiresHeader)
	if expires != "Idempotency-Key-Expires" {
		t.Fatalf("idem.ExpiresHeader is %s over HTTP", expires)
	}
	for _, c := range []struct {
		name, key, body string
		status          int
	}{
		{"response", "order-h1", transfer, http.StatusOK},
		{"recorded error", "order-h2", strings.Replace(transfer, `"1250"`, `"0"`, 1), http.StatusBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := e.create(t, c.body, "Idempotency-Key", c.key)
			if first.status != c.status {
				t.Fatalf("first call: %d %s", first.status, first.body)
			}
			if got := idemHeaders(first.header); !slices.Equal(got, []string{expires}) {
				t.Fatalf("first answer: idem's headers %q, want %q alone", got, expires)
			}
			again := e.create(t, c.body, "Idempotency-Key", c.key)
			if again.status != c.status {
				t.Fatalf("replay: %d %s", again.status, again.body)
			}
			want := []string{expires, idem.HTTPReplayedHeader}
			if got := idemHeaders(again.header); !slices.Equal(got, want) {
				t.Fatalf("replay: idem's headers %q, want %q", got, want)
			}
			if v := again.header.Values(idem.HTTPReplayedHeader); !slices.Equal(v, []string{"true"}) {
				t.Fatalf("replay: %s %q", idem.HTTPReplayedHeader, v)
			}
			for _, r := range []reply{first, again} {
				v := r.header.Values(expires)
				if len(v) != 1 {
					t.Fatalf("%s %q, want one value", expires, v)
				}
				at, err := time.Parse(time.RFC3339, v[0])
				if err != nil || !at.After(time.Now()) {
					t.Fatalf("%s %q: %v; want an RFC 3339 time to come", expires, v[0], err)
				}
				// Not compared between the first answer and the replay: the
				// PostgreSQL store records an error in a transaction of its
				// own, whose time, not the claim's, starts the key's TTL.
			}
			// Other response metadata goes as grpc-gateway forwards it.
			if first.header.Get("Grpc-Metadata-Content-Type") == "" {
				t.Fatalf("first answer: no Grpc-Metadata-Content-Type in %v", first.header)
			}
		})
	}
	if n := e.svc.calls.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
}
