// Binary orders demonstrates idempotency keys across services: it starts an
// OrderService whose PlaceOrder reserves stock with an InventoryService and
// takes payments with the payments example's PaymentService, each a gRPC
// server on a loopback port with a PostgreSQL database of its own. It plays
// a lost response and a crash after the downstream calls, prints what every
// service saw and the rows that exist afterwards, and exits non-zero if a
// side effect happened more than once.
//
//	go run ./examples/orders
//
// It uses $DATABASE_URL, else the libpq defaults, else a throwaway cluster
// started from the PostgreSQL server binaries on the machine (see package
// github.com/idemkit/idem/store/postgres/pgtest); the three databases it
// creates are dropped at the end.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	ordersv1 "github.com/idemkit/idem/examples/gen/orders/v1"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer) error {
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	var pools [3]*pgxpool.Pool
	for i := range pools {
		dsn, drop, err := pg.CreateDatabase(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = drop(context.WithoutCancel(ctx)) }()
		if pools[i], err = pgxpool.New(ctx, dsn); err != nil {
			return err
		}
		defer pools[i].Close()
	}
	sys, err := startSystem(ctx, pools[0], pools[1], pools[2])
	if err != nil {
		return err
	}
	defer sys.close()
	return play(ctx, w, sys)
}

// tenant is the tenant the example places its orders for.
const tenant = "acme"

// orderScope is the scope of the order whose key is orderKey.
func orderScope(orderKey string) store.Scope {
	return store.Scope{Tenant: tenant, Method: ordersv1.OrderService_PlaceOrder_FullMethodName, Key: orderKey}
}

// childKey is the key of the call PlaceOrder makes as step when its own key
// is orderKey, as idem.ChildKey derives it: the hex-encoded SHA-256 of the
// order's tenant, method and key and step, each preceded by its length in
// bytes as a big-endian uint64.
func childKey(orderKey, step string) string {
	parent := orderScope(orderKey)
	return derived(parent.Tenant, parent.Method, parent.Key, step)
}

// callKey is the key of the n-th call to method that PlaceOrder makes
// without naming a step when its own key is orderKey, as
// interceptor.UnaryClientInterceptor derives it: the hex-encoded SHA-256 of
// the order's tenant, method and key, "call", method and n, each preceded
// by its length in bytes as a big-endian uint64.
func callKey(orderKey, method string, n int) string {
	parent := orderScope(orderKey)
	return derived(parent.Tenant, parent.Method, parent.Key, "call", method, strconv.Itoa(n))
}

// derived is the hex-encoded SHA-256 of parts, each preceded by its length
// in bytes as a big-endian uint64.
func derived(parts ...string) string {
	h := sha256.New()
	for _, s := range parts {
		_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// placeOrder calls PlaceOrder for [tenant] without a key of its own: the
// client's idem interceptor attaches one.
func (s *system) placeOrder(ctx context.Context, qty int32, shipping int64) (*ordersv1.Order, bool, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, paymentsvc.TenantHeader, tenant)
	var header metadata.MD
	resp, err := s.orders.PlaceOrder(ctx, &ordersv1.PlaceOrderRequest{
		CustomerId:     "cus_42",
		Sku:            "sku-espresso-beans",
		Quantity:       qty,
		UnitPriceCents: 1250,
		ShippingCents:  shipping,
		Currency:       "EUR",
	}, grpc.Header(&header))
	return resp.GetOrder(), len(header.Get(idem.ReplayedHeader)) > 0, err
}

func short(key string) string {
	if len(key) > 12 {
		return key[:12] + "…"
	}
	return key
}

func play(ctx context.Context, w io.Writer, s *system) error {
	var failed []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			failed = append(failed, fmt.Sprintf(format, args...))
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tPLACEORDER ATTEMPTS\tORDER KEY\tRESULT\tREPLAYED")

	// 1. The response is lost on its way back; the retry interceptor sends
	// the call again with the same key and gets the recorded order.
	s.lossy.arm(1)
	before := len(s.orderLog.all())
	o1, replayed, err := s.placeOrder(ctx, 2, 0)
	check(err == nil && replayed, "lost response: err=%v replayed=%v, want a replay", err, replayed)
	a1 := s.orderLog.all()[before:]
	fmt.Fprintf(tw, "response lost, retried\t%d\t%s\t%s\t%v\n", len(a1), short(a1[0].key), result(err), replayed)

	// 2. The orders server reserves stock and takes both payments, then
	// crashes before its commit. The retry runs PlaceOrder again, and its
	// downstream calls carry the same derived keys.
	s.crash.arm(1)
	before = len(s.orderLog.all())
	paymBefore := len(s.paymLog.all())
	o2, replayed, err := s.placeOrder(ctx, 1, 490)
	check(err == nil && !replayed, "crash before commit: err=%v replayed=%v", err, replayed)
	a2 := s.orderLog.all()[before:]
	fmt.Fprintf(tw, "crash before commit, retried\t%d\t%s\t%s\t%v\n", len(a2), short(a2[0].key), result(err), replayed)
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nCreatePayment calls the payments server saw during the crash scenario (parent key %s):\n", short(a2[0].key))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  CHILD KEY\tDERIVED FROM STEP\tRESULT")
	steps := map[string]string{}
	for n := 1; n <= 2; n++ {
		steps[callKey(a2[0].key, paymentsv1.PaymentService_CreatePayment_FullMethodName, n)] = fmt.Sprintf("%s#%d", paymentsv1.PaymentService_CreatePayment_FullMethodName, n)
	}
	for _, a := range s.paymLog.all()[paymBefore:] {
		step, ok := steps[a.key]
		check(ok, "payments server saw key %s, not derived from the order's key", a.key)
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", short(a.key), step, a.code)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	var orders, payments, reservations int
	for _, q := range []struct {
		db  *pgxpool.Pool
		sql string
		n   *int
	}{
		{s.ordersDB, `SELECT count(*) FROM orders`, &orders},
		{s.paymentsDB, `SELECT count(*) FROM payments`, &payments},
		{s.inventoryDB, `SELECT count(*) FROM reservations`, &reservations},
	} {
		if err := q.db.QueryRow(ctx, q.sql).Scan(q.n); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nrows: orders=%d payments=%d reservations=%d; Reserve executions=%d\n",
		orders, payments, reservations, len(s.inventory.Calls()))
	fmt.Fprintf(w, "order %s: reservation %s, payments %v\n", o1.GetId(), o1.GetReservationId(), o1.GetPaymentIds())
	fmt.Fprintf(w, "order %s: reservation %s, payments %v\n", o2.GetId(), o2.GetReservationId(), o2.GetPaymentIds())
	check(orders == 2, "%d orders, want 2", orders)
	check(payments == 3, "%d payments, want 3 (goods; goods and shipping)", payments)
	check(reservations == 2 && len(s.inventory.Calls()) == 2, "%d reservations after %d executions, want 2 and 2", reservations, len(s.inventory.Calls()))
	check(len(o2.GetPaymentIds()) == 2 && o2.GetPaymentIds()[0] != o2.GetPaymentIds()[1], "the crash order's payments are %v, want two distinct", o2.GetPaymentIds())

	if len(failed) > 0 {
		return fmt.Errorf("%d invariants broken:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	fmt.Fprintln(w, "exactly once across services: every invariant held")
	return nil
}

func result(err error) string {
	if err != nil {
		return err.Error()
	}
	return "OK"
}
