package chaos

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/record"
)

// TestCrashAnywhere kills the payments server with SIGKILL at random
// moments while 16 clients drive 240 payments, 24 of which fail
// validation, and restarts it each time. Every kill lands with calls on the
// wire: in the claim, in the handler, around COMMIT, or writing the
// response.
func TestCrashAnywhere(t *testing.T) {
	forEachMode(t, func(t *testing.T, flags []string) {
		crashAnywhere(t, pgtest.NewDatabase(t), 240, 12, flags...)
	})
}

// crashAnywhere kills the server, started with flags, on the database dsn
// numKills times while 16 clients drive numOps payments, a tenth of which
// fail validation.
func crashAnywhere(t *testing.T, dsn string, numOps, numKills int, flags ...string) {
	const numClients = 16
	srv := startServer(t, binary(t, serverPkg), dsn, flags...)
	pool := newPool(t, dsn)
	dropBackstop(t, pool)

	l := &load{
		ops:   newOps(numOps, 10),
		conns: clients(t, srv.addr, numClients),
	}
	kills := 0
	for range numKills {
		l.faults = append(l.faults, func(int) {
			srv.kill()
			if !srv.killedBySIGKILL() {
				t.Errorf("server ended with %s, want SIGKILL", srv.exitState())
			}
			kills++
			srv.start()
		})
	}
	start := time.Now()
	l.run(t)
	t.Logf("%d kills in %v", kills, time.Since(start).Round(time.Millisecond))

	if kills != numKills {
		t.Fatalf("%d kills, want %d", kills, numKills)
	}
	if inflight := sum(l.inflightAtFault); inflight == 0 {
		t.Error("no kill found a call in flight")
	}
	checkInvariants(t, pool, l.ops)
	l.checkCodes(t, codes.OK, codes.InvalidArgument, codes.Unavailable, codes.Aborted)
}

func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}

// crashHeader asks internal/crashserver to die after COMMIT.
const crashHeader = "x-crash-after-commit"

// TestCrashAfterCommit loses a response whose payment committed: the server
// dies after idem's COMMIT and before gRPC writes the response. The retry,
// served by a fresh process of the ordinary payments server, gets the
// stored response, byte for byte, and no second payment.
func TestCrashAfterCommit(t *testing.T) {
	forEachMode(t, func(t *testing.T, flags []string) {
		crashAfterCommit(t, pgtest.NewDatabase(t), flags...)
	})
}

// crashAfterCommit loses the response of a committed payment on the
// database dsn, with the servers started with flags. The client marks its
// call as the key's first attempt and its retry as the second.
func crashAfterCommit(t *testing.T, dsn string, flags ...string) {
	crash := startServer(t, binary(t, crashServerPkg), dsn, flags...)
	pool := newPool(t, dsn)
	dropBackstop(t, pool)

	req := &paymentsv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 1250, Currency: "EUR", TraceId: "first"}
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, "order-1", paymentsvc.TenantHeader, "acme")
	conn := dial(t, crash.addr)
	defer conn.Close()
	_, err := paymentsv1.NewPaymentServiceClient(conn).CreatePayment(
		metadata.AppendToOutgoingContext(ctx, crashHeader, "1", idem.AttemptHeader, "1"), req)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("call that crashed the server: %v, want UNAVAILABLE", err)
	}
	if err := crash.waitExit(startTimeout); err != nil {
		t.Fatal(err)
	}
	if !crash.killedBySIGKILL() || !crash.output.contains("killing the process before the response is written") {
		t.Fatalf("server ended with %s, not by the crash after COMMIT:\n%s", crash.exitState(), crash.output.String())
	}

	// The payment and its response committed before the crash.
	var paymentID string
	var n int
	err = pool.QueryRow(ctx, `SELECT min(id::text), count(*) FROM payments WHERE tenant_id = 'acme' AND request_key = 'order-1'`).Scan(&paymentID, &n)
	if err != nil || n != 1 {
		t.Fatalf("%d payments after the crash (%v), want 1", n, err)
	}
	var stored []byte
	var code int
	err = pool.QueryRow(ctx, `SELECT response, response_code FROM idempotency_keys
		WHERE tenant = 'acme' AND key = 'order-1' AND status = 'recorded'`).Scan(&stored, &code)
	if err != nil || code != int(codes.OK) {
		t.Fatalf("recorded outcome: code %d, %v; want a completed OK", code, err)
	}

	// The client retries against a new process, with a new trace id.
	srv := startServer(t, binary(t, serverPkg), dsn, flags...)
	codec := &recordingCodec{CodecV2: encoding.GetCodecV2("proto")}
	conn2 := dial(t, srv.addr, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec)))
	defer conn2.Close()
	req.TraceId = "retry"
	var header metadata.MD
	resp, err := paymentsv1.NewPaymentServiceClient(conn2).CreatePayment(
		metadata.AppendToOutgoingContext(ctx, idem.AttemptHeader, "2"), req, grpc.Header(&header))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if resp.GetPayment().GetId() != paymentID {
		t.Fatalf("retry got payment %q, the committed one is %s", resp.GetPayment().GetId(), paymentID)
	}
	if !slices.Contains(header.Get(idem.ReplayedHeader), "true") {
		t.Fatalf("retry not marked as a replay; header %v", header)
	}
	// The row holds the response in a record (internal/record); the reply
	// carries its payload, byte for byte.
	rec, err := record.Decode(stored)
	if err != nil || rec.Bare {
		t.Fatalf("stored response %x: %+v, %v; want a record", stored, rec, err)
	}
	if got := codec.last(); !bytes.Equal(got, rec.Payload) {
		t.Fatalf("retry got response bytes %x, recorded %x", got, rec.Payload)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d payments after the retry (%v), want 1", n, err)
	}
}

// recordingCodec keeps the bytes of the last response it decoded.
type recordingCodec struct {
	encoding.CodecV2
	mu   sync.Mutex
	seen []byte
}

func (c *recordingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.mu.Lock()
	c.seen = data.Materialize()
	c.mu.Unlock()
	return c.CodecV2.Unmarshal(data, v)
}

func (c *recordingCodec) last() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen
}
