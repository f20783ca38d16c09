package interceptor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memory"
)

// corruptSteps writes the row a leased worker left behind, in progress,
// its lease run out, whose saved steps cannot be decoded.
func corruptSteps(t *testing.T, e *env, key string) {
	t.Helper()
	abandonedClaim(t, e, key, "v")
	if _, err := e.pool.Exec(t.Context(), `UPDATE idempotency_keys SET step_names = '{charge_sent,NULL}', step_results = '{ch_42,ch_43}' WHERE key = $1`, key); err != nil {
		t.Fatal(err)
	}
}

// TestUnreadableStepsAreDataLoss: a key whose saved steps cannot be read is
// answered DATA_LOSS (reason IDEMPOTENCY_STEPS_UNREADABLE) at once, to every
// retry, and logged at ERROR with its key; the handler never runs. Once an
// operator deletes the key's row, the next retry runs afresh.
func TestUnreadableStepsAreDataLoss(t *testing.T) {
	e := leasedEnv(t, time.Minute)
	corruptSteps(t, e, "broken")
	for i := range 2 {
		err := callErr(e, "broken")
		st := wantCode(t, err, codes.DataLoss)
		if r := reason(err); r != idem.ReasonStepsUnreadable {
			t.Errorf("call %d: reason %q, want %s", i+1, r, idem.ReasonStepsUnreadable)
		}
		if retryDelay(err) != nil {
			t.Errorf("call %d: DATA_LOSS with a RetryInfo: retrying does not help", i+1)
		}
		if strings.Contains(st.Message(), "step_names") || strings.Contains(st.Message(), "NULL") {
			t.Errorf("call %d: the client saw the storage error: %q", i+1, st.Message())
		}
	}
	if n := e.svc.count(); n != 0 {
		t.Fatalf("the handler ran %d times under unreadable steps", n)
	}
	log := e.log.String()
	if !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "key=broken") {
		t.Errorf("log %q: want an ERROR naming the key", log)
	}

	// The operator's way out, as docs/operations.md says.
	if _, err := e.pool.Exec(t.Context(), `DELETE FROM idempotency_keys WHERE tenant = '' AND method = $1 AND key = 'broken'`, doMethod); err != nil {
		t.Fatal(err)
	}
	if err := callErr(e, "broken"); err != nil {
		t.Fatalf("retry after the row was deleted: %v", err)
	}
	if n := e.svc.count(); n != 1 {
		t.Fatalf("%d executions after the row was deleted, want 1", n)
	}
}

// failingLeaseStore fails every ClaimLeased as a lost connection would.
type failingLeaseStore struct{ store.Store }

func (failingLeaseStore) ClaimLeased(context.Context, store.Scope, store.LeaseRequest) (store.LeasedClaim, error) {
	return store.LeasedClaim{}, errors.New("read tcp 10.0.0.1:5432: connection reset by peer")
}

// TestTransientLeaseFailureIsNotDataLoss: a store that fails transiently is
// answered UNAVAILABLE with a retry delay, never DATA_LOSS.
func TestTransientLeaseFailureIsNotDataLoss(t *testing.T) {
	e := newEnv(t, setup{memory: true,
		memoryStore: failingLeaseStore{memory.New()},
		opts:        []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute})}})
	err := callErr(e, "k")
	wantCode(t, err, codes.Unavailable)
	if retryDelay(err) == nil {
		t.Errorf("UNAVAILABLE without RetryInfo: %v", err)
	}
	if n := e.svc.count(); n != 0 {
		t.Errorf("the handler ran %d times", n)
	}
}
