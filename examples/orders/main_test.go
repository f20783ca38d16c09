package main

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/examples/orders/inventorysvc"
	"github.com/idemkit/idem/examples/orders/ordersvc"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

const createPayment = "/payments.v1.PaymentService/CreatePayment"

func newSystem(t *testing.T) (*system, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	s, err := startSystem(ctx, pgtest.NewPool(t), pgtest.NewPool(t), pgtest.NewPool(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s, ctx
}

func count(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// keys returns the keys of the attempts in log.
func keys(log *attemptLog) []string {
	var out []string
	for _, a := range log.all() {
		out = append(out, a.key)
	}
	return out
}

// TestLostResponse: PlaceOrder commits, its response is lost, and the
// retry interceptor sends it again with the same key. The server sees one
// key in two attempts, and there is one order, one payment and one
// reservation.
func TestLostResponse(t *testing.T) {
	s, ctx := newSystem(t)
	s.lossy.arm(1)
	o, replayed, err := s.placeOrder(ctx, 2, 0)
	if err != nil || !replayed {
		t.Fatalf("PlaceOrder: err=%v replayed=%v, want the recorded order replayed", err, replayed)
	}
	ks := keys(s.orderLog)
	if len(ks) != 2 || ks[0] == "" || ks[0] != ks[1] {
		t.Fatalf("orders server saw keys %q, want one key in two attempts", ks)
	}
	if n := count(t, s.ordersDB, `SELECT count(*) FROM orders WHERE id = $1 AND request_key = $2`, o.GetId(), ks[0]); n != 1 {
		t.Errorf("%d rows for the returned order under its key, want 1", n)
	}
	for what, n := range map[string]int{
		"orders":       count(t, s.ordersDB, `SELECT count(*) FROM orders`),
		"payments":     count(t, s.paymentsDB, `SELECT count(*) FROM payments`),
		"reservations": count(t, s.inventoryDB, `SELECT count(*) FROM reservations`),
		"Reserve runs": len(s.inventory.Calls()),
	} {
		if n != 1 {
			t.Errorf("%d %s, want 1", n, what)
		}
	}
}

// TestCrashBeforeCommitRepeatsChildKeys: PlaceOrder makes its downstream
// calls and then fails before its commit; the retry runs it again. Its two
// CreatePayment calls carry different keys, the retry repeats both exactly,
// and the payments and the reservation exist once.
func TestCrashBeforeCommitRepeatsChildKeys(t *testing.T) {
	s, ctx := newSystem(t)
	s.crash.arm(1)
	o, _, err := s.placeOrder(ctx, 1, 490)
	if err != nil {
		t.Fatal(err)
	}
	ks := keys(s.orderLog)
	if len(ks) != 2 || ks[0] != ks[1] {
		t.Fatalf("orders server saw keys %q, want one key in two attempts", ks)
	}
	parent := ks[0]
	goods, shipping := callKey(parent, createPayment, 1), callKey(parent, createPayment, 2)
	if goods == shipping {
		t.Fatal("the two payments share a key")
	}
	if got, want := keys(s.paymLog), []string{goods, shipping, goods, shipping}; !slices.Equal(got, want) {
		t.Fatalf("payments server saw keys\n%q\nwant\n%q", got, want)
	}
	for _, k := range []string{goods, shipping} {
		if n := count(t, s.paymentsDB, `SELECT count(*) FROM payments WHERE request_key = $1`, k); n != 1 {
			t.Errorf("%d payments under %s, want 1", n, k)
		}
	}
	if n := count(t, s.paymentsDB, `SELECT count(*) FROM payments`); n != 2 {
		t.Errorf("%d payments, want 2", n)
	}
	reserve := childKey(parent, ordersvc.ReserveStep)
	if calls := s.inventory.Calls(); !slices.Equal(calls, []inventorysvc.Call{{Key: reserve, SKU: "sku-espresso-beans", Quantity: 1}}) {
		t.Errorf("Reserve executions %+v, want one under %s", calls, reserve)
	}
	if n := count(t, s.inventoryDB, `SELECT count(*) FROM reservations WHERE request_key = $1`, reserve); n != 1 {
		t.Errorf("%d reservations, want 1", n)
	}
	// The order that committed refers to the payments made before the crash.
	var ids []string
	if err := s.ordersDB.QueryRow(ctx, `SELECT payment_ids FROM orders WHERE id = $1`, o.GetId()).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s.paymentsDB, `SELECT count(*) FROM payments WHERE id::text = ANY($1)`, ids); len(ids) != 2 || n != 2 {
		t.Errorf("order's payment ids %v match %d payments, want 2", ids, n)
	}
	if n := count(t, s.ordersDB, `SELECT count(*) FROM orders`); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}

// TestRetryAttemptsCarryOneKey: every attempt the retry interceptor makes
// carries the key idem attached once; the server sees one key, N attempts,
// and one order results.
func TestRetryAttemptsCarryOneKey(t *testing.T) {
	s, ctx := newSystem(t)
	s.crash.arm(3)
	if _, _, err := s.placeOrder(ctx, 3, 0); err != nil {
		t.Fatal(err)
	}
	ks := keys(s.orderLog)
	if len(ks) != 4 {
		t.Fatalf("orders server saw %d attempts, want 4", len(ks))
	}
	for _, k := range ks {
		if k != ks[0] {
			t.Fatalf("attempts carried keys %q, want one", ks)
		}
	}
	if n := count(t, s.ordersDB, `SELECT count(*) FROM orders WHERE request_key = $1`, ks[0]); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
	if n := count(t, s.paymentsDB, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
	if n := len(s.inventory.Calls()); n != 1 {
		t.Errorf("%d Reserve executions, want 1", n)
	}
}

// TestDemo runs the whole demo: run fails unless every invariant it checks
// held.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"response lost, retried", "CreatePayment#2", "orders=2 payments=3 reservations=2", "every invariant held"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
