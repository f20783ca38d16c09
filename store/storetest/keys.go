package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// keyCases exercise the rules of store.Scope.Validate, in Claim and in
// ClaimLeased.
var keyCases = []testCase{
	{name: "KeysWithinTheRulesAreHeld", run: func(t *testing.T, s store.Store, _ Config) {
		for _, k := range validKeys() {
			t.Run(k.name, func(t *testing.T) {
				txn := claimTxn(t, s, k.key, fp)
				if err := txn.Record(t.Context(), okOutcome("atomic")); err != nil {
					t.Fatalf("Record: %v", err)
				}
				wantRecorded(t, claimEntry(t, s, k.key, fp), fp, okOutcome("atomic"))

				leased := k.key
				leased.Key = k.key.Key[:len(k.key.Key)-1] + "L"
				l := takeLease(t, s, leased, fp, time.Minute)
				if err := l.Record(t.Context(), okOutcome("leased")); err != nil {
					t.Fatalf("Record: %v", err)
				}
				wantRecorded(t, leaseEntry(t, s, leased, fp, time.Minute), fp, okOutcome("leased"))
			})
		}
		// A non-ASCII tenant is its own scope, apart from its ASCII look-alike.
		ascii := store.Scope{Tenant: "Zurich", Method: key.Method, Key: key.Key}
		txn := claimTxn(t, s, ascii, other)
		if err := txn.Record(t.Context(), okOutcome("ascii")); err != nil {
			t.Fatalf("Record: %v", err)
		}
		wantRecorded(t, claimEntry(t, s, store.Scope{Tenant: "Zürich", Method: key.Method, Key: key.Key}, fp), fp, okOutcome("atomic"))
	}},

	{name: "InvalidKeysAreRefused", run: func(t *testing.T, s store.Store, _ Config) {
		for _, k := range invalidKeys() {
			t.Run(k.name, func(t *testing.T) {
				c, err := s.Claim(t.Context(), k.key, store.ClaimRequest{Fingerprint: fp})
				if c.Txn != nil {
					_ = c.Txn.Release(context.Background())
				}
				wantInvalidKey(t, "Claim", err, k.field)
				if c.Txn != nil || c.Entry != nil {
					t.Errorf("Claim of an invalid key = %s, want neither", describeClaim(c))
				}
				lc, err := s.ClaimLeased(t.Context(), k.key, store.LeaseRequest{Fingerprint: fp, Lease: time.Minute})
				if lc.Lease != nil {
					_ = lc.Lease.Release(context.Background())
				}
				wantInvalidKey(t, "Lease", err, k.field)
				if lc.Lease != nil || lc.Entry != nil {
					t.Errorf("Lease of an invalid key = %s, want neither", describeLeasedClaim(lc))
				}
			})
		}
		// The refusals left the store as it was: the valid neighbour of each
		// invalid key is still free.
		claimTxn(t, s, key, fp)
	}},
}

type namedKey struct {
	name  string
	key   store.Scope
	field string // the field an invalid key breaks the rule of
}

// validKeys are keys at the bounds of store.Scope.Validate and keys of
// non-ASCII text: every store must hold them.
func validKeys() []namedKey {
	return []namedKey{
		{name: "AllAtTheirBounds", key: store.Scope{
			Tenant: strings.Repeat("t", store.MaxTenantLength),
			Method: "/" + strings.Repeat("m", store.MaxMethodLength-1),
			Key:    strings.Repeat("k", store.MaxKeyLength),
		}},
		{name: "EmptyTenant", key: store.Scope{Method: key.Method, Key: key.Key}},
		{name: "NonASCIITenant", key: store.Scope{Tenant: "Zürich", Method: key.Method, Key: key.Key}},
		// 85 three-byte characters: 255 bytes.
		{name: "NonASCIITenantAtItsBound", key: store.Scope{Tenant: strings.Repeat("東", store.MaxTenantLength/3), Method: key.Method, Key: key.Key}},
		{name: "NonASCIIMethodAndKey", key: store.Scope{Tenant: key.Tenant, Method: "/idem.test.v1.Tést/Dö", Key: "ключ-1"}},
	}
}

// invalidKeys are keys past the bounds of store.Scope.Validate, or with text
// that is not UTF-8 or holds a NUL byte.
func invalidKeys() []namedKey {
	with := func(name, field string, f func(k *store.Scope)) namedKey {
		k := key
		f(&k)
		return namedKey{name: name, key: k, field: field}
	}
	return []namedKey{
		with("TenantPastItsBound", "tenant", func(k *store.Scope) { k.Tenant = strings.Repeat("t", store.MaxTenantLength+1) }),
		with("Tenant10KB", "tenant", func(k *store.Scope) { k.Tenant = strings.Repeat("t", 10<<10) }),
		with("TenantNotUTF8", "tenant", func(k *store.Scope) { k.Tenant = "bad-\xff\xfe" }),
		with("TenantWithNUL", "tenant", func(k *store.Scope) { k.Tenant = "ten\x00ant" }),
		with("EmptyMethod", "method", func(k *store.Scope) { k.Method = "" }),
		with("MethodPastItsBound", "method", func(k *store.Scope) { k.Method = "/" + strings.Repeat("m", store.MaxMethodLength) }),
		with("MethodNotUTF8", "method", func(k *store.Scope) { k.Method = "/idem.test.v1.Test/\xff" }),
		with("MethodWithNUL", "method", func(k *store.Scope) { k.Method = "/idem.test.v1.Test/Do\x00" }),
		with("EmptyKey", "key", func(k *store.Scope) { k.Key = "" }),
		with("KeyPastItsBound", "key", func(k *store.Scope) { k.Key = strings.Repeat("k", store.MaxKeyLength+1) }),
		with("KeyNotUTF8", "key", func(k *store.Scope) { k.Key = "caf\xe9" }),
		with("KeyWithNUL", "key", func(k *store.Scope) { k.Key = "key\x00" }),
	}
}

// wantInvalidKey fails the test unless err wraps store.ErrInvalidScope and
// names field.
func wantInvalidKey(t *testing.T, op string, err error, field string) {
	t.Helper()
	if !errors.Is(err, store.ErrInvalidScope) {
		t.Errorf("%s: %v, want an error wrapping store.ErrInvalidScope", op, err)
		return
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("%s: %q does not name the field %s", op, err, field)
	}
}
