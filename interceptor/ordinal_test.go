package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
)

// TestStepNamedLikeAnOrdinalGetsItsOwnKey: a leased handler calls Charge
// plainly (its first call to the method) and then, in a step named as that
// call's ordinal ("/…/Do#1"), charges the same amount again. The two are
// two operations: they carry two keys, and the downstream service acts
// twice.
func TestStepNamedLikeAnOrdinalGetsItsOwnKey(t *testing.T) {
	downPool := newEffectsPool(t)
	down := &testService{pool: downPool}
	downRec, downAddr := serve(t, downPool, down)
	provider := dial(t, downAddr, grpc.WithUnaryInterceptor(interceptor.UnaryClientInterceptor()))
	e := newEnv(t, setup{memory: true, opts: []idem.Option{idem.WithMethodPolicy(doMethod, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute})}})
	var executions []int64
	e.svc.setHook(func(ctx context.Context, _ string) error {
		resp, err := provider.Do(ctx, &testv1.DoRequest{Value: "charge 10 EUR"})
		if err != nil {
			return err
		}
		executions = append(executions, resp.GetExecution())
		_, err = idem.Step(ctx, methodDo+"#1", func(ctx context.Context) ([]byte, error) {
			resp, err := provider.Do(ctx, &testv1.DoRequest{Value: "charge 10 EUR"})
			executions = append(executions, resp.GetExecution())
			return nil, err
		})
		return err
	})
	if err := callErr(e, "order-1"); err != nil {
		t.Fatal(err)
	}
	as := downRec.of(methodDo)
	if len(as) != 2 {
		t.Fatalf("the provider saw %d calls, want 2", len(as))
	}
	if k0, k1 := onlyKey(t, as[0]), onlyKey(t, as[1]); k0 == k1 {
		t.Errorf("the plain call and the step %q both carried the key %s", methodDo+"#1", k0)
	}
	if n := down.count(); n != 2 || len(executions) != 2 || executions[0] == executions[1] {
		t.Errorf("the provider acted %d times, answering executions %v; want two charges", n, executions)
	}
	if n := countRows(t, downPool, `SELECT count(*) FROM effects`); n != 2 {
		t.Errorf("%d charges recorded by the provider, want 2", n)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
