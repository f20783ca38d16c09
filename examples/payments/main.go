// Binary payments demonstrates exactly-once payments with idem: it starts
// the example PaymentService on a loopback port against a fresh PostgreSQL
// database, plays the situations that double-charge a naive server, prints
// what each call got, the rows that exist afterwards and the results idem
// counted in its metrics, and exits non-zero if any invariant breaks.
//
//	go run ./examples/payments
//
// It uses $DATABASE_URL, else the libpq defaults, else a throwaway cluster
// started from the PostgreSQL server binaries on the machine (see package
// github.com/idemkit/idem/store/postgres/pgtest); the database it creates is
// dropped at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/internal/pgtest"
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
	dsn, drop, err := pg.CreateDatabase(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = drop(context.WithoutCancel(ctx)) }()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		return err
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	// idem's metrics go to an in-process reader, which the demo reads back
	// at the end to show what idem counted.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.WithoutCancel(ctx)) }()
	srv, err := paymentsvc.NewServer(pool, idem.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	d := &demo{pool: pool, metrics: reader}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	d.client = paymentsv1.NewPaymentServiceClient(conn)
	// lossy is a second connection on which every response is lost on the
	// way back: the server commits, the client sees UNAVAILABLE.
	lossy, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(d.loseResponse))
	if err != nil {
		return err
	}
	defer lossy.Close()
	d.lossy = paymentsv1.NewPaymentServiceClient(lossy)
	return d.play(ctx, w)
}

type demo struct {
	client, lossy paymentsv1.PaymentServiceClient
	pool          *pgxpool.Pool
	metrics       *sdkmetric.ManualReader
	lost          *paymentsv1.Payment // what the server sent on the lossy connection
	rows          [][]string
	failed        []string
}

func (d *demo) loseResponse(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
		return err
	}
	d.lost = reply.(*paymentsv1.CreatePaymentResponse).GetPayment()
	return status.Error(codes.Unavailable, "response lost in transit")
}

// call sends CreatePayment for tenant "acme" with key.
func (d *demo) call(ctx context.Context, key string, amount int64) (*paymentsv1.Payment, bool, error) {
	return d.callOn(ctx, d.client, key, amount)
}

func (d *demo) callOn(ctx context.Context, client paymentsv1.PaymentServiceClient, key string, amount int64) (*paymentsv1.Payment, bool, error) {
	ctx = metadata.AppendToOutgoingContext(ctx,
		idem.KeyHeader, key,
		paymentsvc.TenantHeader, "acme")
	var header metadata.MD
	resp, err := client.CreatePayment(ctx, &paymentsv1.CreatePaymentRequest{
		CustomerId:  "cus_42",
		AmountCents: amount,
		Currency:    "EUR",
		Note:        "demo",
	}, grpc.Header(&header))
	replayed := len(header.Get(idem.ReplayedHeader)) > 0
	return resp.GetPayment(), replayed, err
}

func (d *demo) check(ok bool, format string, args ...any) {
	if !ok {
		d.failed = append(d.failed, fmt.Sprintf(format, args...))
	}
}

func (d *demo) report(step, key string, p *paymentsv1.Payment, replayed bool, err error) {
	result, id := "OK", p.GetId()
	if err != nil {
		result = status.Code(err).String()
	}
	d.rows = append(d.rows, []string{step, key, result, id, fmt.Sprint(replayed)})
}

func (d *demo) play(ctx context.Context, w io.Writer) error {
	// 1. A first call creates the payment.
	first, replayed, err := d.call(ctx, "order-1001", 1250)
	d.report("first call", "order-1001", first, replayed, err)
	d.check(err == nil && !replayed, "first call: %v", err)

	// 2. The response is lost on the way back; the client retries with
	// the same key and gets the same payment instead of a second one.
	_, _, err = d.callOn(ctx, d.lossy, "order-1002", 990)
	d.report("response lost", "order-1002", d.lost, false, err)
	d.check(status.Code(err) == codes.Unavailable && d.lost != nil, "call whose response is lost: %v", err)
	retried, replayed, err := d.call(ctx, "order-1002", 990)
	d.report("retry after loss", "order-1002", retried, replayed, err)
	d.check(err == nil && replayed && retried.GetId() == d.lost.GetId(),
		"retry after a lost response got %v (replayed=%v, err=%v), want payment %s", retried.GetId(), replayed, err, d.lost.GetId())

	// 3. Fifty copies of one request arrive at once, as a retrying mesh
	// might send them; each retries on ABORTED after the suggested delay.
	const copies = 50
	st, err := d.storm(ctx, "order-1003", copies)
	d.check(err == nil, "concurrent duplicates: %v", err)
	d.check(len(st.ids) == 1, "concurrent duplicates saw %d payment ids, want 1", len(st.ids))
	d.check(st.replayed == copies-1, "%d of %d duplicates were replays, want %d", st.replayed, copies, copies-1)
	for id := range st.ids {
		d.rows = append(d.rows, []string{
			fmt.Sprintf("%d concurrent duplicates", copies), "order-1003",
			fmt.Sprintf("OK x%d (%d ABORTED, retried)", st.oks, st.aborted), id,
			fmt.Sprintf("%d of %d", st.replayed, copies),
		})
	}

	// 4. The same key with another amount is a client bug, not a retry.
	_, replayed, err = d.call(ctx, "order-1001", 5000)
	d.report("key reused, other amount", "order-1001", nil, replayed, err)
	d.check(status.Code(err) == codes.FailedPrecondition, "key reuse: %v, want FailedPrecondition", err)

	// 5. A deterministic error is recorded and replayed, not re-executed.
	_, replayed, err = d.call(ctx, "order-1004", 0)
	d.report("invalid amount", "order-1004", nil, replayed, err)
	d.check(status.Code(err) == codes.InvalidArgument && !replayed, "invalid amount: %v", err)
	_, replayed, err = d.call(ctx, "order-1004", 0)
	d.report("retry of invalid amount", "order-1004", nil, replayed, err)
	d.check(status.Code(err) == codes.InvalidArgument && replayed, "retry of invalid amount: %v (replayed=%v)", err, replayed)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tKEY\tRESULT\tPAYMENT\tREPLAYED")
	for _, r := range d.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r[0], r[1], r[2], r[3], r[4])
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	// The rows are what matter: one payment per key that succeeded, none
	// for the invalid one.
	counts := map[string]int{}
	rows, err := d.pool.Query(ctx, `SELECT request_key, count(*) FROM payments GROUP BY request_key ORDER BY request_key`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			return err
		}
		counts[key] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var keys int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&keys); err != nil {
		return err
	}
	fmt.Fprintf(w, "\npayments rows: order-1001=%d order-1002=%d order-1003=%d order-1004=%d; idempotency keys recorded: %d\n",
		counts["order-1001"], counts["order-1002"], counts["order-1003"], counts["order-1004"], keys)
	for _, k := range []string{"order-1001", "order-1002", "order-1003"} {
		d.check(counts[k] == 1, "%d payments for %s, want 1", counts[k], k)
	}
	d.check(counts["order-1004"] == 0, "%d payments for the invalid order-1004, want 0", counts["order-1004"])
	d.check(keys == 4, "%d idempotency keys recorded, want 4", keys)

	// What idem counted: every call that ran the handler (the first of each
	// key, the one whose response was lost, the recorded validation
	// error), every replay, every duplicate told to retry, the reused key.
	results, err := d.results(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "idem results of CreatePayment: executed=%d replayed=%d in_use=%d reused=%d\n",
		results["executed"], results["replayed"], results["in_use"], results["reused"])
	want := map[string]int64{"executed": 4, "replayed": 1 + copies - 1 + 1, "in_use": int64(st.aborted), "reused": 1}
	for result, n := range want {
		d.check(results[result] == n, "idem counted %d calls %s, want %d", results[result], result, n)
	}
	for result, n := range results {
		d.check(want[result] != 0, "idem counted %d calls %s, want none", n, result)
	}

	if len(d.failed) > 0 {
		return fmt.Errorf("%d invariants broken:\n  %s", len(d.failed), strings.Join(d.failed, "\n  "))
	}
	fmt.Fprintln(w, "exactly once: every invariant held")
	return nil
}

// results returns the counts of idem.server.requests for CreatePayment,
// by result, read from the in-process metric reader.
func (d *demo) results(ctx context.Context) (map[string]int64, error) {
	var rm metricdata.ResourceMetrics
	if err := d.metrics.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "idem.server.requests" || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				method, _ := dp.Attributes.Value("rpc.method")
				result, _ := dp.Attributes.Value("idem.result")
				if method.AsString() == "payments.v1.PaymentService/CreatePayment" {
					out[result.AsString()] += dp.Value
				}
			}
		}
	}
	return out, nil
}

// stormResult tallies what the copies of one request got.
type stormResult struct {
	ids                    map[string]bool // payment ids in the OK answers
	oks, replayed, aborted int
}

// storm sends n identical requests at once and returns what they finally
// got. A caller answered ABORTED waits for the RetryInfo delay and tries
// again, as a well-behaved client does.
func (d *demo) storm(ctx context.Context, key string, n int) (stormResult, error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		res  = stormResult{ids: map[string]bool{}}
		errs []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				p, replayed, err := d.call(ctx, key, 4200)
				mu.Lock()
				if status.Code(err) == codes.Aborted {
					res.aborted++
					mu.Unlock()
					time.Sleep(retryDelay(err))
					continue
				}
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				res.oks++
				if replayed {
					res.replayed++
				}
				res.ids[p.GetId()] = true
				return
			}
		}()
	}
	wg.Wait()
	return res, errors.Join(errs...)
}

func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 100 * time.Millisecond
}
