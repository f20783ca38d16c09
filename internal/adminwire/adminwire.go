// Package adminwire is what the adapters of idem's wires hand package
// admin's transport-neutral core, which imports no transport: the caller
// of an admin call, as the wire saw it (its request headers and TLS state,
// for the Authorizer), and how each wire reads the google.rpc.Status an
// error carries (an Authorizer's refusal, a finished handler's error),
// since the core cannot read a gRPC status or a *connect.Error itself.
//
// grpc-go's adapter (package interceptor) and connect-go's (package
// idemconnect) each register their reading from init: a program that serves
// the admin service on one wire and registers handlers of the other with
// its finisher, or whose authorizer answers with the other wire's error,
// still reads the status, as both adapters are linked into it.
package adminwire

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem"
)

// Caller is who made an admin call, as the wire saw it.
type Caller struct {
	// Header is the request's headers as gRPC metadata carries them:
	// lower-case names, the values of -bin names decoded.
	Header map[string][]string
	// TLS is the state of the call's TLS connection; nil without TLS.
	TLS *tls.ConnectionState
	// Peer is the network address the call came from, as the wire gives
	// it; empty when it gives none.
	Peer string
}

// HTTPCaller returns the caller of r, an HTTP request: its headers as
// [Metadata] maps them, its TLS state, and its RemoteAddr as the peer.
func HTTPCaller(r *http.Request) Caller {
	return Caller{Header: Metadata(r.Header), TLS: r.TLS, Peer: r.RemoteAddr}
}

// Metadata returns h, HTTP headers, as gRPC metadata carries them:
// lower-case names, and the values of names ending in -bin decoded from
// base64, padded or not, as the gRPC and Connect protocols send them (a
// value that does not decode is kept as it is). Every HTTP wire of the
// admin service maps a request's headers with it: idemconnect's, and the
// admin package's console.
func Metadata(h http.Header) map[string][]string {
	md := make(map[string][]string, len(h))
	for name, values := range h {
		name = strings.ToLower(name)
		for _, v := range values {
			if strings.HasSuffix(name, "-bin") {
				if b, err := decodeBinary(v); err == nil {
					v = string(b)
				}
			}
			md[name] = append(md[name], v)
		}
	}
	return md
}

// decodeBinary decodes the value of a -bin header, as
// connect.DecodeBinaryHeader does: unpadded when its length says so.
func decodeBinary(v string) ([]byte, error) {
	if len(v)%4 != 0 {
		return base64.RawStdEncoding.DecodeString(v)
	}
	return base64.StdEncoding.DecodeString(v)
}

type callerKey struct{}

// NewContext returns ctx with c, the caller of the call ctx runs.
func NewContext(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// FromContext returns the caller NewContext put in ctx; the zero Caller
// when there is none (a Server's method called directly).
func FromContext(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// readers are the wires' readings of an error's status, registered from
// the adapters' init functions.
var readers []func(error) (*spb.Status, bool)

// RegisterStatus adds read, a wire's reading of the status an error of
// that wire carries, to those [Status] tries. read reports false for any
// other error, context errors included, so that no two wires read one
// error. Adapters call it from init: it is not safe to call once calls
// run.
func RegisterStatus(read func(error) (*spb.Status, bool)) {
	readers = append(readers, read)
}

// Status returns the status err carries, and whether it carries one: an
// [*idem.Error]'s, else the one a registered wire reads.
func Status(err error) (*spb.Status, bool) {
	var ie *idem.Error
	if errors.As(err, &ie) {
		return ie.Status(), true
	}
	for _, read := range readers {
		if st, ok := read(err); ok {
			return st, true
		}
	}
	return nil, false
}
