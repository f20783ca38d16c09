package admin

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash"
	"slices"

	"github.com/idemkit/idem/store"
)

// A page token is base64url(version | HMAC-SHA256 | cursor): the MAC covers
// the version, the filter the page was listed with and the store's cursor,
// so a token cannot be altered, nor reused with another filter, without
// the server noticing. The cursor is the store's own text, which may show
// where the listing stands (a creation time and a key): the token is
// tamper-evident, not secret.
const tokenVersion = 1

var errBadToken = errors.New("page token is invalid, or was issued for another filter")

// tokens signs and opens page tokens with one key.
type tokens struct{ key []byte }

// A listing is what a page token is bound to: its writeTo writes what
// selects its entries, which no other listing writes alike.
type listing interface{ writeTo(h hash.Hash) }

// keyListing is a ListKeys filter, or a GetKeyStats one.
type keyListing store.KeyFilter

func (f keyListing) writeTo(h hash.Hash) { writeFilter(h, store.KeyFilter(f)) }

// auditListing is a ListAudit filter. Its first byte, 2, is one that no
// keyListing writes first (writeFilter writes 0 or 1), so that a token of
// one listing is never taken for the other's.
type auditListing store.AuditFilter

func (f auditListing) writeTo(h hash.Hash) {
	h.Write([]byte{2})
	writeTenant(h, f.AllTenants, f.Tenant)
	writeString(h, f.Method)
	writeString(h, f.Key)
	for _, tm := range [...]int64{f.Since.UnixNano(), f.Until.UnixNano()} {
		writeInt(h, tm)
	}
	writeInt(h, boolInt(f.Since.IsZero())<<1|boolInt(f.Until.IsZero()))
}

func (t tokens) mac(f listing, cursor string) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte{tokenVersion})
	f.writeTo(m)
	writeString(m, cursor)
	return m.Sum(nil)
}

// seal returns the page token of cursor, listed with f; "" for "".
func (t tokens) seal(f listing, cursor string) string {
	if cursor == "" {
		return ""
	}
	b := append([]byte{tokenVersion}, t.mac(f, cursor)...)
	return base64.RawURLEncoding.EncodeToString(append(b, cursor...))
}

// open returns the cursor of token, which must have been sealed with f;
// "" for "".
func (t tokens) open(f listing, token string) (string, error) {
	if token == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) <= 1+sha256.Size || b[0] != tokenVersion {
		return "", errBadToken
	}
	cursor := string(b[1+sha256.Size:])
	if !hmac.Equal(b[1:1+sha256.Size], t.mac(f, cursor)) {
		return "", errBadToken
	}
	return cursor, nil
}

// writeTenant writes a filter's tenants: all, or the one named (every
// tenant's filter ignores its Tenant, so it writes none).
func writeTenant(h hash.Hash, all bool, tenant string) {
	if all {
		h.Write([]byte{1})
		tenant = ""
	} else {
		h.Write([]byte{0})
	}
	writeString(h, tenant)
}

// writeFilter writes what selects f's entries, every field but Limit (a
// page's size may change from page to page), each length-prefixed so that
// no two filters write alike; States are sorted, as their order selects
// nothing.
func writeFilter(h hash.Hash, f store.KeyFilter) {
	writeTenant(h, f.AllTenants, f.Tenant)
	writeString(h, f.Method)
	states := make([]string, len(f.States))
	for i, s := range f.States {
		states[i] = string(s)
	}
	slices.Sort(states)
	states = slices.Compact(states)
	writeInt(h, int64(len(states)))
	for _, s := range states {
		writeString(h, s)
	}
	for _, tm := range [...]int64{f.CreatedAfter.UnixNano(), f.CreatedBefore.UnixNano()} {
		writeInt(h, tm)
	}
	writeInt(h, boolInt(f.CreatedAfter.IsZero())<<1|boolInt(f.CreatedBefore.IsZero()))
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func writeInt(h hash.Hash, v int64) {
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(v)))
}

func writeString(h hash.Hash, s string) {
	writeInt(h, int64(len(s)))
	h.Write([]byte(s))
}
