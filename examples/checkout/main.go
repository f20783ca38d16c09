// Binary checkout demonstrates idem's leased mode with steps and a
// finisher: a CheckoutService that reserves stock in PostgreSQL, charges a
// stub payment provider over gRPC and confirms the order, each an
// idem.Step whose result is saved under the request's key. Replicas
// of the checkout server (this program, run again as child processes) are
// killed with SIGKILL in the middle of checkouts. In the first story the
// client retries on a second replica, is told to wait while the dead
// replica's lease runs, then takes the key over and resumes after the last
// saved step. In the second the client gives up, and the finisher that
// every replica runs finishes the checkout anyway; the client's retry,
// when it comes back, gets the outcome replayed. It prints what each
// replica did and the rows that exist afterwards, and exits non-zero if an
// invariant broke: a side effect that happened more than once, an
// abandoned checkout left unfinished, an answer that does not name the
// rows.
//
//	go run ./examples/checkout
//
// It uses $DATABASE_URL, else the libpq defaults, else a throwaway cluster
// started from the PostgreSQL server binaries on the machine (see package
// github.com/idemkit/idem/store/postgres/pgtest); the two databases it
// creates are dropped at the end.
//
// With -admin-listen ADDR it also serves idem's admin service
// (idem.admin.v1.AdminService) on ADDR, a listener of its own, with gRPC
// health checking and server reflection so that grpcurl works, over the
// checkout database: FinishKey finishes an abandoned checkout at once,
// through a finisher of this process, rather than after the replicas'
// grace. Its demo authorizer admits the callers that send the operator
// token of -admin-token (default $IDEM_ADMIN_TOKEN) as "authorization:
// Bearer TOKEN"; the demo refuses to start without one. In production, use
// mTLS or your identity provider instead. After the stories it leaves
// checkout order-1 abandoned after its charge step, with no finisher
// running, and keeps serving, for an operator to find and finish it, until
// interrupted. With -console-listen ADDR too, it serves the admin
// service's console (admin.NewConsole) at http://ADDR/console/, behind the
// same token, which a browser sends as the password of HTTP basic
// authentication (any user name).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	"github.com/idemkit/idem/examples/internal/adminlisten"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/internal/pgtest"
)

func main() {
	if isReplica() {
		if err := serveReplica(); err != nil {
			fmt.Fprintln(os.Stderr, "replica:", err)
			os.Exit(1)
		}
		return
	}
	adminListen := flag.String("admin-listen", "", "address to serve idem's admin service on, for operators (default: none)")
	consoleListen := flag.String("console-listen", "", "address to serve the admin service's console on, at /console/, for operators' browsers, with -admin-listen (default: none)")
	adminToken := flag.String("admin-token", os.Getenv(adminlisten.TokenEnv), "operator token the admin service requires as \"authorization: Bearer TOKEN\", a demo authorizer (default $"+adminlisten.TokenEnv+"; required with -admin-listen)")
	flag.Parse()
	interrupted, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	adm := adminFlags{token: *adminToken, until: interrupted}
	if *adminListen != "" {
		if *adminToken == "" {
			fmt.Fprintln(os.Stderr, "FAIL: -admin-listen:", adminlisten.ErrNoToken)
			os.Exit(2)
		}
		var err error
		if adm.lis, err = net.Listen("tcp", *adminListen); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			os.Exit(1)
		}
		if *consoleListen != "" {
			if adm.console, err = net.Listen("tcp", *consoleListen); err != nil {
				fmt.Fprintln(os.Stderr, "FAIL:", err)
				os.Exit(1)
			}
		}
	} else if *consoleListen != "" {
		fmt.Fprintln(os.Stderr, "FAIL: -console-listen serves the admin service's console: give -admin-listen too")
		os.Exit(2)
	}
	// The system serves the admin service after the stories, until
	// interrupted: then nothing bounds the whole run.
	ctx, cancel := context.WithTimeout(interrupted, 2*time.Minute)
	if adm.lis != nil {
		cancel()
		ctx, cancel = context.WithCancel(interrupted)
	}
	defer cancel()
	if err := runAdmin(ctx, os.Stdout, os.Stderr, adm); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

// run plays the demo, writing the story to w and the replicas' logs to
// logs.
func run(ctx context.Context, w, logs io.Writer) error {
	return runAdmin(ctx, w, logs, adminFlags{})
}

// runAdmin is run, serving the admin service too unless adm.lis is nil.
func runAdmin(ctx context.Context, w, logs io.Writer, adm adminFlags) error {
	if adm.console != nil {
		defer adm.console.Close()
	}
	if adm.lis != nil {
		defer adm.lis.Close()
		if adm.token == "" {
			return adminlisten.ErrNoToken
		}
	}
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
	if adm.lis == nil {
		return play(ctx, w, sys)
	}
	stopAdmin, err := sys.serveAdmin(adm.lis, adm.console, adm.token)
	if err != nil {
		return err
	}
	defer stopAdmin()
	fmt.Fprintf(w, "idem's admin service listens on %s (a demo operator token: use mTLS or your identity provider in production).\n", adm.lis.Addr())
	if err := play(ctx, w, sys); err != nil {
		return err
	}
	if err := sys.leaveAbandoned(ctx); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nCheckout %s was abandoned after its charge step, and no finisher runs now: its lease has run out, it waits for an operator.\n", abandonedKey)
	fmt.Fprintf(w, "The admin service stays up on %s until interrupted, for a look at the keys the stories left:\n", adm.lis.Addr())
	fmt.Fprintf(w, "  grpcurl -plaintext -H 'authorization: Bearer TOKEN' -d '{}' %s idem.admin.v1.AdminService/ListKeys\n", adm.lis.Addr())
	if adm.console != nil {
		fmt.Fprintf(w, "and its console at http://%s%s (the token is the password; any user name).\n", adm.console.Addr(), adminlisten.ConsolePath)
	}
	<-adm.until.Done()
	return nil
}

func play(ctx context.Context, w io.Writer, sys *system) error {
	fmt.Fprintf(w, "CheckoutService runs in leased mode with a %v lease; each checkout buys %d × %s at %d cents.\n",
		lease(), quantity, sku, unitPrice)
	fmt.Fprintf(w, "Every replica runs a finisher: it finishes a checkout whose lease ran out more than %v ago (its grace) and that nobody took over.\n",
		lease())
	var failed []string

	st, err := sys.play(ctx, checkoutsvc.PointChargeAnswered)
	if err != nil {
		return err
	}
	r, err := sys.rows(ctx, st.key)
	if err != nil {
		return err
	}
	tell(w, st, r)
	failed = append(failed, st.broken(r)...)

	ab, err := sys.abandon(ctx, checkoutsvc.StepCharge, lease())
	if err != nil {
		return err
	}
	if r, err = sys.rows(ctx, ab.key); err != nil {
		return err
	}
	late, err := sys.retryLater(ctx, ab.key)
	if err != nil {
		return err
	}
	tellAbandoned(w, ab, r, late)
	failed = append(failed, ab.broken(r)...)
	failed = append(failed, late.broken(r)...)

	t, err := sys.totals(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nafter two checkouts: charges=%d reservations=%d orders=%d Charge calls=%d; stock %d -> %d\n",
		t.charges, t.reservations, t.orders, t.chargeCalls, initialStock, t.stock)
	if t.charges != 2 || t.reservations != 2 || t.orders != 2 || t.chargeCalls != 3 || t.stock != initialStock-2*quantity {
		failed = append(failed, fmt.Sprintf("want 2 charges, reservations and orders, 3 Charge calls and %d left in stock", initialStock-2*quantity))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d invariants broken:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	fmt.Fprintln(w, "resumed, not restarted, and finished without the client: every invariant held")
	return nil
}

// tell prints a story of a client that retried.
func tell(w io.Writer, st *story, r rows) {
	fmt.Fprintf(w, "\n== 1. replica A is killed at %q; the client retries; key %s\n", st.crashAt, st.key)
	fmt.Fprintln(w, "replica A:")
	printEvents(w, st.first)
	fmt.Fprintf(w, "  %-9s %-17s process ended: %s\n", "", "(killed)", exit(st.firstExit))
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
	fmt.Fprintf(w, "  later retry:      %s, replayed=%v, same answer=%v\n", answer(st.againErr), st.againReplayed, proto.Equal(st.again, st.resp))
	fmt.Fprintln(w, "replica B:")
	printEvents(w, st.second)
	printRows(w, st.key, r)
}

// tellAbandoned prints the story of a client that gave up.
func tellAbandoned(w io.Writer, ab *abandonment, r rows, late *lateRetry) {
	fmt.Fprintf(w, "\n== 2. replica A is killed at %q; the client gives up; key %s\n", ab.crashAt, ab.key)
	fmt.Fprintln(w, "replica A:")
	printEvents(w, ab.first)
	fmt.Fprintf(w, "  %-9s %-17s process ended: %s\n", "", "(killed)", exit(ab.firstExit))
	fmt.Fprintf(w, "client, to replica A: %s\n", answer(ab.firstErr))
	fmt.Fprintln(w, "client: gives up and goes away without retrying")
	fmt.Fprint(w, "while abandoned, ")
	printRows(w, ab.key, ab.abandoned)
	fmt.Fprintf(w, "replica B's finisher, which took the abandoned checkout over by itself (recorded %v after the client's answer):\n",
		ab.took.Round(100*time.Millisecond))
	printEvents(w, ab.finisher)
	printRows(w, ab.key, r)
	fmt.Fprintln(w, "client, back later, to a replica C started since:")
	if late.err != nil {
		fmt.Fprintf(w, "  retry:            %s\n", answer(late.err))
	} else {
		fmt.Fprintf(w, "  retry:            OK order %s, charge %s, replayed=%v\n", late.resp.GetOrderId(), late.resp.GetChargeId(), late.replayed)
	}
	fmt.Fprintf(w, "  the key lives until %s (%v from now): until then every retry replays this answer\n",
		late.expires, r.expiresIn.Round(time.Minute))
	fmt.Fprintln(w, "replica C:")
	printEvents(w, late.events)
}

func printEvents(w io.Writer, events []event) {
	for _, e := range events {
		fmt.Fprintf(w, "  %-9s %-17s %s\n", e.runner, e.point, describe(e))
	}
}

func printRows(w io.Writer, key string, r rows) {
	fmt.Fprintf(w, "rows for this key: charges=%d (Charge calls=%d, key %s…) reservations=%d orders=%d; idem: %s at %s, request kept=%v\n",
		r.charges, r.chargeCalls, chargeKey(key)[:12], r.reservations, r.orders, r.keyStatus, r.lastStep, r.requestKept)
}

func describe(e event) string {
	switch e.point {
	case checkoutsvc.PointStarted:
		if e.runner == runnerFinisher {
			return "takes the abandoned checkout over"
		}
		return "the handler runs"
	case checkoutsvc.PointReservationMade:
		return "reservation " + e.detail + " made, the step not saved yet"
	case checkoutsvc.PointChargeAnswered:
		if id, ok := strings.CutSuffix(e.detail, checkoutsvc.Replayed); ok {
			return "provider replayed charge " + id + ", the step not saved yet"
		}
		return "provider made charge " + e.detail + ", the step not saved yet"
	case checkoutsvc.PointOrderMade:
		return "order " + e.detail + " made, the step not saved yet"
	case pointOutcome:
		return "idem: " + e.detail
	}
	if id, ok := strings.CutSuffix(e.detail, checkoutsvc.Resumed); ok {
		return "saved by the dead attempt: " + id + ", not run again"
	}
	return "saved: " + e.detail
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
