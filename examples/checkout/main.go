// Binary checkout demonstrates idem's leased mode with recovery points: a
// CheckoutService that reserves stock in PostgreSQL, charges a stub payment
// provider over gRPC and confirms the order, saving a recovery point after
// each step. A replica of the checkout server (this program, run again as a
// child process) is killed with SIGKILL in the middle of a checkout; the
// client's retry goes to a second replica, is told to wait while the dead
// replica's lease runs, then takes the key over and resumes from the last
// saved step. It prints what each replica did and the rows that exist
// afterwards, and exits non-zero if a side effect happened more than once.
//
//	go run ./examples/checkout
//
// It uses $DATABASE_URL, else the libpq defaults, else a throwaway cluster
// started from the PostgreSQL server binaries on the machine (see package
// github.com/idemkit/idem/store/postgres/pgtest); the two databases it
// creates are dropped at the end.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

func main() {
	if isReplica() {
		if err := serveReplica(); err != nil {
			fmt.Fprintln(os.Stderr, "replica:", err)
			os.Exit(1)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

// run plays the demo, writing the story to w and the replicas' logs to
// logs.
func run(ctx context.Context, w, logs io.Writer) error {
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	var dsns [2]string
	for i := range dsns {
		var drop func(context.Context) error
		if dsns[i], drop, err = pg.CreateDatabase(ctx); err != nil {
			return err
		}
		defer func() { _ = drop(context.WithoutCancel(ctx)) }()
	}
	providerDB, err := pgxpool.New(ctx, dsns[1])
	if err != nil {
		return err
	}
	defer providerDB.Close()
	sys, err := startSystem(ctx, dsns[0], providerDB, &lockedWriter{w: logs})
	if err != nil {
		return err
	}
	defer sys.close()
	return play(ctx, w, sys)
}

func play(ctx context.Context, w io.Writer, sys *system) error {
	fmt.Fprintf(w, "CheckoutService runs in leased mode with a %v lease; each checkout buys %d × %s at %d cents.\n",
		lease(), quantity, sku, unitPrice)
	var failed []string
	for _, crashAt := range []string{checkoutsvc.StepChargeSent, checkoutsvc.PointChargeAnswered} {
		st, err := sys.play(ctx, crashAt)
		if err != nil {
			return err
		}
		r, err := sys.rows(ctx, st.key)
		if err != nil {
			return err
		}
		tell(w, st, r)
		failed = append(failed, st.broken(r)...)
	}

	left, err := sys.stock(ctx)
	if err != nil {
		return err
	}
	var charges, reservations, orders int
	for _, q := range []struct {
		db  *pgxpool.Pool
		sql string
		n   *int
	}{
		{sys.providerDB, `SELECT count(*) FROM charges`, &charges},
		{sys.checkoutDB, `SELECT count(*) FROM reservations`, &reservations},
		{sys.checkoutDB, `SELECT count(*) FROM orders`, &orders},
	} {
		if err := q.db.QueryRow(ctx, q.sql).Scan(q.n); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nafter two checkouts: charges=%d reservations=%d orders=%d Charge calls=%d; stock %d -> %d\n",
		charges, reservations, orders, len(sys.provider.Calls()), initialStock, left)
	if charges != 2 || reservations != 2 || orders != 2 || left != initialStock-2*quantity {
		failed = append(failed, fmt.Sprintf("want 2 charges, reservations and orders and %d left in stock", initialStock-2*quantity))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d invariants broken:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	fmt.Fprintln(w, "resumed, not restarted: every invariant held")
	return nil
}

// tell prints one story.
func tell(w io.Writer, st *story, r rows) {
	fmt.Fprintf(w, "\n== replica A is killed at %q; key %s\n", st.crashAt, st.key)
	fmt.Fprintln(w, "replica A:")
	for _, e := range st.first {
		fmt.Fprintf(w, "  %-17s %s\n", e.point, describe(e))
	}
	fmt.Fprintf(w, "  %-17s process ended: %s\n", "(killed)", exit(st.firstExit))
	fmt.Fprintf(w, "client, to replica A: %s\n", answer(st.firstErr))
	fmt.Fprintln(w, "client, to replica B:")
	fmt.Fprintf(w, "  retry at once:    %s\n", answer(st.busy))
	for _, d := range st.waited {
		fmt.Fprintf(w, "  waited %v as asked\n", d.Round(time.Millisecond))
	}
	if st.err != nil {
		fmt.Fprintf(w, "  retry:            %s\n", answer(st.err))
	} else {
		fmt.Fprintf(w, "  retry:            OK order %s, charge %s, replayed=%v\n", st.resp.GetOrderId(), st.resp.GetChargeId(), st.replayed)
	}
	fmt.Fprintf(w, "  later retry:      %s, replayed=%v, same answer=%v\n", answer(st.againErr), st.againReplayed,
		st.again.GetOrderId() == st.resp.GetOrderId() && st.again.GetChargeId() == st.resp.GetChargeId())
	fmt.Fprintln(w, "replica B:")
	for _, e := range st.second {
		fmt.Fprintf(w, "  %-17s %s\n", e.point, describe(e))
	}
	fmt.Fprintf(w, "rows for this key: charges=%d (Charge calls=%d, key %s…) reservations=%d orders=%d; idem: %s at %s\n",
		r.charges, r.chargeCalls, chargeKey(st.key)[:12], r.reservations, r.orders, r.keyStatus, r.recoveryPoint)
}

func describe(e event) string {
	switch e.point {
	case checkoutsvc.PointStarted:
		if e.detail == "" {
			return "no recovery point: start afresh"
		}
		return "resume after " + e.detail
	case checkoutsvc.PointChargeAnswered:
		id, replayed := strings.CutSuffix(e.detail, " replayed")
		if replayed {
			return "provider replayed charge " + id
		}
		return "provider made charge " + id
	}
	return "saved, payload " + e.detail
}

func answer(err error) string {
	if err == nil {
		return "OK"
	}
	msg := err.Error()
	if d, ok := interceptor.RetryDelay(err); ok {
		msg += fmt.Sprintf(" (retry in %v)", d.Round(time.Millisecond))
	}
	return msg
}

func exit(err error) string {
	if err == nil {
		return "exited"
	}
	return err.Error()
}

// lockedWriter serializes writes from the replicas' log copiers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
