// Package idemtest holds the helpers of idem's own tests that more than
// one package's tests use: the adapters' (interceptor, idemconnect,
// idemgateway) and the transport conformance suite's. It is not public
// API.
package idemtest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// CallKey is the key idem gives the n-th call (from 1) to method that the
// keyed request parent makes without naming a step: the hex-encoded
// SHA-256 of parent's tenant, method and key, "call", method and n in
// decimal, each part preceded by its length in bytes as a big-endian
// uint64. It is computed here from that documented layout rather than by
// idem's own code, so that a change of the layout shows.
func CallKey(parent store.Scope, method string, n int) string {
	return Derived(parent.Tenant, parent.Method, parent.Key, "call", method, strconv.Itoa(n))
}

// StepKey is the child key of the step named step of the keyed request
// parent, as idem.ChildKey documents it: the hex-encoded SHA-256 of
// parent's tenant, method and key and step, each part preceded by its
// length as CallKey's are.
func StepKey(parent store.Scope, step string) string {
	return Derived(parent.Tenant, parent.Method, parent.Key, step)
}

// Derived is the hex-encoded SHA-256 of parts, each preceded by its length
// in bytes as a big-endian uint64.
func Derived(parts ...string) string {
	h := sha256.New()
	var l [8]byte
	for _, s := range parts {
		binary.BigEndian.PutUint64(l[:], uint64(len(s)))
		h.Write(l[:])
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// NewEngine returns an engine on st with opts, failing the test when
// idem.New refuses them.
func NewEngine(t testing.TB, st store.Store, opts ...idem.Option) *idem.Engine {
	t.Helper()
	e, err := idem.New(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Eventually polls cond until it holds or timeout has passed, and reports
// whether it held. It is for waits on a condition that nothing signals; its
// answer does not depend on how often it polls.
func Eventually(timeout time.Duration, cond func() bool) bool {
	limit := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(limit) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// WaitFor polls cond until it holds, failing the test after timeout.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("gave up waiting after %v", timeout)
	}
}

// TenantFromHeader is the tenant function of the tests' engines: the
// request metadata x-tenant-id, its values joined with commas ("" when
// there is none).
func TenantFromHeader(_ context.Context, header map[string][]string) (string, error) {
	return strings.Join(header["x-tenant-id"], ","), nil
}

// Listen returns a listener on a free port of 127.0.0.1, closed when the
// test ends.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	return lis
}

// EachStore runs f as a subtest for each store the adapters' tests serve
// on: PostgreSQL (memory false), and store/memory, whose cases need no
// database and so also run under go test -short.
func EachStore(t *testing.T, f func(t *testing.T, memory bool)) {
	t.Helper()
	for _, mem := range []bool{false, true} {
		name := "postgres"
		if mem {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) { f(t, mem) })
	}
}
