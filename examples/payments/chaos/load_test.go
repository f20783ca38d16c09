package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
)

// op is one logical payment: a key and the request retried under it.
type op struct {
	tenant string
	key    string
	req    *paymentsv1.CreatePaymentRequest
	// valid requests must end in one payment; the others fail validation,
	// a deterministic error that is recorded and must leave no payment.
	valid bool

	// Filled in by the client that runs the op.
	start    time.Time // its first attempt
	answers  []answer  // the definitive answers it accepted
	attempts int
	err      error // why the client gave up
}

// answer is a definitive answer a client accepted.
type answer struct {
	code      codes.Code
	paymentID string
	replayed  bool
	// raw is the answer as it came over the wire: the response message's
	// bytes, or the deterministic marshal of the error's google.rpc.Status.
	raw []byte
	at  time.Time // when it arrived
}

// newOps returns n payments spread over four tenants; every invalidEvery-th
// has a non-positive amount, which the service rejects with
// INVALID_ARGUMENT.
func newOps(n, invalidEvery int) []*op {
	ops := make([]*op, n)
	for i := range ops {
		o := &op{
			tenant: fmt.Sprintf("tenant-%d", i%4),
			key:    "pay-" + randomHex(12),
			valid:  i%invalidEvery != invalidEvery-1,
			req: &paymentsv1.CreatePaymentRequest{
				CustomerId:  fmt.Sprintf("cus_%d", i),
				AmountCents: int64(100 + i),
				Currency:    "EUR",
				Note:        fmt.Sprintf("op %d", i),
			},
		}
		if !o.valid {
			o.req.AmountCents = -1
		}
		ops[i] = o
	}
	return ops
}

// load runs ops from concurrent clients, each retrying an op under its key
// until it has accepted the definitive answers it wants, while faults are
// injected at chosen points of the run.
type load struct {
	ops []*op
	// conns are the clients; each runs one op at a time.
	conns []*grpc.ClientConn
	// confirmations is how many definitive answers a client collects per op:
	// the first, then retries of a client unsure whether its answer
	// arrived, which must all agree with it.
	confirmations int
	// faults are run, one after the other, while the ops are in flight:
	// fault i once the (i+1)-th share of the ops has been handed out, after
	// a random delay. The run waits for each fault to return before it hands
	// out more ops, while the clients keep retrying the ops they hold.
	faults []func(i int)
	// opTimeout bounds the retries of one op, and runTimeout the whole
	// run, so that a server that never answers fails the test in minutes.
	opTimeout, runTimeout time.Duration
	deadline              time.Time

	// pace, if set, is the shortest time between the starts of two ops of
	// one client.
	pace time.Duration

	inflight atomic.Int64 // calls on the wire
	// inflightAtFault counts the calls on the wire when each fault began.
	inflightAtFault []int64
	// answered counts the definitive answers.
	answered atomic.Int64

	mu          sync.Mutex
	codes       map[codes.Code]int // every answer, definitive or not
	others      []string           // the messages of codes no test expects
	unavailable map[string]int     // the messages of UNAVAILABLE answers
	// noHint counts the UNAVAILABLE and ABORTED answers without a
	// RetryInfo, by code.
	noHint map[codes.Code]int
}

// attemptTimeout bounds one call; a server that died mid-call answers
// sooner, with UNAVAILABLE.
const attemptTimeout = 15 * time.Second

// run runs every op and injects the faults. It returns when all ops are
// done or given up.
func (l *load) run(t *testing.T) {
	t.Helper()
	ch, wait := l.start()
	next := 0
	for i, fault := range l.faults {
		until := (i + 1) * len(l.ops) / (len(l.faults) + 1)
		for ; next < until; next++ {
			ch <- l.ops[next]
		}
		// A random moment soon after, while the share's calls are on the
		// wire: a call takes a few milliseconds, a share of ops a few calls
		// of each client.
		time.Sleep(time.Duration(mrand.Int64N(int64(4 * time.Millisecond))))
		l.inflightAtFault = append(l.inflightAtFault, l.inflight.Load())
		fault(i)
	}
	for ; next < len(l.ops); next++ {
		ch <- l.ops[next]
	}
	close(ch)
	wait()
	t.Logf("answers by code: %v; calls in flight at each fault: %v", l.codeSummary(), l.inflightAtFault)
}

// runUntil runs ops as run does, without faults, but hands them out only
// until stop is closed (or none is left), and drops those it did not hand
// out from l.ops. It returns when the ops handed out are done or given up.
func (l *load) runUntil(t *testing.T, stop <-chan struct{}) {
	t.Helper()
	ch, wait := l.start()
	next := 0
handing:
	for ; next < len(l.ops); next++ {
		select {
		case ch <- l.ops[next]:
		case <-stop:
			break handing
		}
	}
	close(ch)
	wait()
	l.ops = l.ops[:next]
	t.Logf("%d ops; answers by code: %v", next, l.codeSummary())
}

// start starts the clients, which run the ops sent on ch until it is
// closed; wait waits for them to finish.
func (l *load) start() (ch chan<- *op, wait func()) {
	l.codes = make(map[codes.Code]int)
	l.unavailable = make(map[string]int)
	l.noHint = make(map[codes.Code]int)
	if l.confirmations == 0 {
		l.confirmations = 2
	}
	if l.opTimeout == 0 {
		l.opTimeout = time.Minute
	}
	if l.runTimeout == 0 {
		l.runTimeout = 4 * time.Minute
	}
	l.deadline = time.Now().Add(l.runTimeout)
	ops := make(chan *op)
	var wg sync.WaitGroup
	for _, conn := range l.conns {
		client := paymentsv1.NewPaymentServiceClient(conn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var next time.Time
			for o := range ops {
				time.Sleep(time.Until(next))
				next = time.Now().Add(l.pace)
				l.do(client, o)
			}
		}()
	}
	return ops, wg.Wait
}

// do runs one op to completion.
func (l *load) do(client paymentsv1.PaymentServiceClient, o *op) {
	start := time.Now()
	if o.start.IsZero() {
		o.start = start
	}
	for len(o.answers) < l.confirmations {
		if time.Since(start) > l.opTimeout || time.Now().After(l.deadline) {
			o.err = fmt.Errorf("no definitive answer after %d attempts in %v", o.attempts, time.Since(start).Round(time.Millisecond))
			return
		}
		o.attempts++
		a, err := l.call(client, o)
		st := status.Convert(err)
		l.count(st)
		if err == nil || recorded(st) {
			o.answers = append(o.answers, a)
			l.answered.Add(1)
			continue
		}
		// Not definitive: retry under the same key, after the delay the
		// server asked for, or a short one.
		wait := time.Duration(10+mrand.IntN(40)) * time.Millisecond
		if d := retryDelay(st); d > 0 {
			wait = d
		}
		time.Sleep(wait)
	}
}

// call makes one attempt of o, with a trace id of its own: a retry may
// change fields excluded from the fingerprint.
func (l *load) call(client paymentsv1.PaymentServiceClient, o *op) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	// The attempt's number, as idem's client interceptor sends it: 1 for
	// the key's first, more for its retries (auto mode reads it).
	ctx = metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, o.key, paymentsvc.TenantHeader, o.tenant,
		idem.AttemptHeader, strconv.Itoa(o.attempts))
	req := proto.Clone(o.req).(*paymentsv1.CreatePaymentRequest)
	req.TraceId = randomHex(8)
	var header metadata.MD
	codec := &recordingCodec{CodecV2: encoding.GetCodecV2("proto")}
	l.inflight.Add(1)
	resp, err := client.CreatePayment(ctx, req, grpc.Header(&header), grpc.ForceCodecV2(codec))
	l.inflight.Add(-1)
	a := answer{
		code:      status.Code(err),
		paymentID: resp.GetPayment().GetId(),
		replayed:  slices.Contains(header.Get(idem.ReplayedHeader), "true"),
		raw:       codec.last(),
		at:        time.Now(),
	}
	if err != nil {
		a.raw, _ = proto.MarshalOptions{Deterministic: true}.Marshal(status.Convert(err).Proto())
	}
	return a, err
}

func (l *load) count(st *status.Status) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.codes[st.Code()]++
	if st.Code() == codes.Unavailable {
		l.unavailable[st.Message()]++
	}
	if (st.Code() == codes.Unavailable || st.Code() == codes.Aborted) && retryDelay(st) == 0 {
		l.noHint[st.Code()]++
	}
	switch st.Code() {
	case codes.OK, codes.InvalidArgument, codes.Unavailable, codes.Aborted:
	default:
		if len(l.others) < 20 {
			l.others = append(l.others, st.String())
		}
	}
}

// checkCodes fails t if any answer had a code outside allowed.
func (l *load) checkCodes(t *testing.T, allowed ...codes.Code) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, n := range l.codes {
		if !slices.Contains(allowed, c) {
			t.Errorf("%d answers with code %v, which this fault must not cause; examples: %v", n, c, l.others)
		}
	}
}

// storageText are words of database errors that no answer may carry:
// server messages, SQLSTATEs, connection parameters, driver names.
var storageText = []string{"SQLSTATE", "ERROR:", "FATAL", "database", "user=", "127.0.0.1", "pgx", "postgres"}

// checkNoStorageText fails t if an UNAVAILABLE answer carried storageText,
// and returns how many answers had a message starting with prefix.
func (l *load) checkNoStorageText(t *testing.T, prefix string) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for msg, count := range l.unavailable {
		for _, w := range storageText {
			if strings.Contains(strings.ToLower(msg), strings.ToLower(w)) {
				t.Errorf("%d UNAVAILABLE answers carried %q: %q", count, w, msg)
			}
		}
		if strings.HasPrefix(msg, prefix) {
			n += count
		}
	}
	t.Logf("UNAVAILABLE answers by message: %v", l.unavailable)
	return n
}

func (l *load) codeSummary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var parts []string
	for c, n := range l.codes {
		parts = append(parts, fmt.Sprintf("%v=%d", c, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// retryDelay returns the RetryInfo delay of st, or 0.
func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// scope is a key's scope in the payments service: tenant and key (one
// method).
type scope struct{ tenant, key string }

// keyRow is what the tests read of a key's row.
type keyRow struct {
	status string
	code   int
}

// state is what a database holds: payments by scope, and key rows.
type state struct {
	payments map[scope][]string
	keys     map[scope]keyRow
	total    int
}

// snapshot reads the payments and the key rows.
func snapshot(t *testing.T, pool *pgxpool.Pool) state {
	t.Helper()
	ctx := context.Background()
	st := state{payments: make(map[scope][]string), keys: make(map[scope]keyRow)}
	rows, err := pool.Query(ctx, `SELECT tenant_id, request_key, id::text FROM payments`)
	if err != nil {
		t.Fatal(err)
	}
	err = forEachRow(rows, func(r pgx.Rows) error {
		var s scope
		var id string
		if err := r.Scan(&s.tenant, &s.key, &id); err != nil {
			return err
		}
		st.payments[s] = append(st.payments[s], id)
		st.total++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT tenant, key, status, coalesce(response_code, -1) FROM idempotency_keys`)
	if err != nil {
		t.Fatal(err)
	}
	err = forEachRow(rows, func(r pgx.Rows) error {
		var s scope
		var k keyRow
		if err := r.Scan(&s.tenant, &s.key, &k.status, &k.code); err != nil {
			return err
		}
		st.keys[s] = k
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkInvariants checks the run's outcome against the database: each valid
// op has exactly one payment, whose id every answer the client accepted
// carries; each invalid op has none and a recorded INVALID_ARGUMENT; there
// is no other payment and no key left in progress.
func checkInvariants(t *testing.T, pool *pgxpool.Pool, ops []*op) {
	t.Helper()
	st := snapshot(t, pool)
	payments, keys, total := st.payments, st.keys, st.total

	valid, failures := 0, 0
	for _, o := range ops {
		s := scope{o.tenant, o.key}
		if failures >= 10 {
			t.Fatalf("more failures not shown")
		}
		fail := func(format string, args ...any) {
			failures++
			t.Errorf("key %s of %s: "+format, append([]any{o.key, o.tenant}, args...)...)
		}
		if o.err != nil {
			fail("%v", o.err)
			continue
		}
		if k, ok := keys[s]; !ok || k.status != "recorded" {
			fail("idempotency key row %+v (present %v), want completed", k, ok)
		}
		ids := payments[s]
		if !o.valid {
			if len(ids) != 0 {
				fail("%d payments for a request that failed validation", len(ids))
			}
			if keys[s].code != int(codes.InvalidArgument) {
				fail("recorded code %d, want INVALID_ARGUMENT", keys[s].code)
			}
			for _, a := range o.answers {
				if a.code != codes.InvalidArgument {
					fail("accepted answer %v, want INVALID_ARGUMENT", a.code)
				}
			}
			continue
		}
		valid++
		if len(ids) != 1 {
			fail("%d payments, want exactly 1", len(ids))
			continue
		}
		for _, a := range o.answers {
			if a.code != codes.OK || a.paymentID != ids[0] {
				fail("accepted answer %v with payment %q; the payment row is %s", a.code, a.paymentID, ids[0])
			}
		}
		if !o.answers[len(o.answers)-1].replayed {
			fail("the confirming answer was not marked as a replay")
		}
	}
	if total != valid {
		t.Errorf("%d payments in all, want %d, one per valid op", total, valid)
	}
	if len(keys) != len(ops) {
		t.Errorf("%d idempotency keys, want %d", len(keys), len(ops))
	}
	attempts := 0
	for _, o := range ops {
		attempts += o.attempts
	}
	t.Logf("%d ops (%d valid, %d rejected by validation) in %d attempts; %d payments",
		len(ops), valid, len(ops)-valid, attempts, total)
}

func forEachRow(rows pgx.Rows, f func(pgx.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// dropBackstop removes the payments table's unique (tenant_id,
// request_key) constraint, so that a second execution for one key would
// leave a second row instead of failing: the tests then check idem, not the
// backstop.
func dropBackstop(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var name string
	err := pool.QueryRow(ctx, `SELECT conname FROM pg_constraint
		WHERE conrelid = 'payments'::regclass AND contype = 'u'`).Scan(&name)
	if err != nil {
		t.Fatalf("find the payments backstop: %v", err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE payments DROP CONSTRAINT `+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
}

// newPool opens a pool on dsn for the test's own queries.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// clients returns n client connections to addr, closed when t ends.
func clients(t *testing.T, addr string, n int) []*grpc.ClientConn {
	t.Helper()
	conns := make([]*grpc.ClientConn, n)
	for i := range conns {
		conns[i] = dial(t, addr)
		t.Cleanup(func() { conns[i].Close() })
	}
	return conns
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// recorded reports whether idem records an error of st's code, as it does
// by default (idem.WithClassifier): such an answer is definitive, and a
// retry under the same key gets it again.
func recorded(st *status.Status) bool {
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.AlreadyExists, codes.NotFound:
		return true
	}
	return false
}
