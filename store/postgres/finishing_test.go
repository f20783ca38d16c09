package postgres_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

// TestAbandonedListsADamagedRowFlagged: a row whose kept metadata or
// method cannot be read is listed with Unreadable set, and the other rows
// as usual. Before, one such row failed the whole list ("a list kept in
// idempotency_keys is malformed"), and no call could be finished.
func TestAbandonedListsADamagedRowFlagged(t *testing.T) {
	pool := pgtest.NewPool(t)
	s := postgres.New(pool)
	kept := &store.Call{Method: "/svc/Charge", Request: []byte("request"), Metadata: map[string][]string{"x-user": {"u-7"}}}
	for _, k := range []string{"healthy", "null-header-name", "no-method", "unpaired-headers"} {
		lc, err := s.ClaimLeased(ctx, store.Scope{Tenant: "t", Method: "/svc/Charge", Key: k}, store.LeaseRequest{Fingerprint: []byte("fp"), Call: kept, Lease: time.Hour})
		if err != nil || lc.Lease == nil {
			t.Fatalf("lease %s: %+v, %v", k, lc, err)
		}
		if err := lc.Lease.Release(ctx); err != nil { // kept, its lease ended
			t.Fatal(err)
		}
	}
	exec(t, pool, `UPDATE idempotency_keys SET request_header_names = '{NULL}', request_header_values = '{x}' WHERE key = 'null-header-name'`)
	exec(t, pool, `UPDATE idempotency_keys SET request_method = NULL WHERE key = 'no-method'`)
	exec(t, pool, `UPDATE idempotency_keys SET request_header_values = NULL WHERE key = 'unpaired-headers'`)

	list, err := s.Abandoned(ctx, 0, 10)
	if err != nil || len(list) != 4 {
		t.Fatalf("Abandoned = %+v, %v; want the 4 calls", list, err)
	}
	byKey := map[string]store.AbandonedCall{}
	for _, a := range list {
		byKey[a.Scope.Key] = a
	}
	if a := byKey["healthy"]; a.Unreadable != nil || a.Call.Method != kept.Method || !slices.Equal(a.Call.Metadata["x-user"], []string{"u-7"}) {
		t.Errorf("the healthy call is listed as %+v", a)
	}
	for k, column := range map[string]string{"null-header-name": "request_header_names", "no-method": "request_method",
		"unpaired-headers": "request_header_values"} {
		a := byKey[k]
		if a.Unreadable == nil || a.Scope.Tenant != "t" || string(a.Fingerprint) != "fp" {
			t.Errorf("%s is listed as %+v; want it flagged unreadable, with its key and fingerprint", k, a)
		} else if !strings.Contains(a.Unreadable.Error(), column) {
			t.Errorf("%s's error %q does not name the damaged column, %s", k, a.Unreadable, column)
		}
	}
}
