package chaos

import (
	"bytes"
	"context"
	"encoding/base64"
	be "encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

// badEnv is the payments server of paymentsvc.NewServer in this process, on
// a database of its own, with a second keyed method (TestService.Do, which
// records an effects row) under the same idem interceptor.
type badEnv struct {
	addr     string
	pool     *pgxpool.Pool
	payments paymentsv1.PaymentServiceClient
	test     testv1.TestServiceClient
}

func newBadEnv(t *testing.T) *badEnv {
	t.Helper()
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (key text NOT NULL, value text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	srv, err := paymentsvc.NewServer(pool, idem.WithLogger(idemLogger))
	if err != nil {
		t.Fatal(err)
	}
	testv1.RegisterTestServiceServer(srv, &effectService{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn := dial(t, lis.Addr().String())
	t.Cleanup(func() { conn.Close() })
	return &badEnv{
		addr:     lis.Addr().String(),
		pool:     pool,
		payments: paymentsv1.NewPaymentServiceClient(conn),
		test:     testv1.NewTestServiceClient(conn),
	}
}

// effectService implements TestService.Do by recording an effects row on
// the transaction that holds the key.
type effectService struct {
	testv1.UnimplementedTestServiceServer
}

func (effectService) Do(ctx context.Context, req *testv1.DoRequest) (*testv1.DoResponse, error) {
	tx, ok := postgres.TxFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "Do must run under the idem interceptor")
	}
	key, _ := idem.KeyFromContext(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO effects (key, value) VALUES ($1, $2)`, key, req.GetValue()); err != nil {
		return nil, err
	}
	return &testv1.DoResponse{Value: req.GetValue(), Execution: 1}, nil
}

// rows counts the rows of the payments, idempotency_keys and effects tables.
func (e *badEnv) rows(t *testing.T) (payments, keys, effects int) {
	t.Helper()
	err := e.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM payments),
		(SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM effects)`).Scan(&payments, &keys, &effects)
	if err != nil {
		t.Fatal(err)
	}
	return payments, keys, effects
}

// wantTenant fails t unless every payment and key row is tenant's.
func (e *badEnv) wantTenant(t *testing.T, tenant string) {
	t.Helper()
	var others int
	err := e.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM payments WHERE tenant_id <> $1)
		+ (SELECT count(*) FROM idempotency_keys WHERE tenant <> $1)`, tenant).Scan(&others)
	if err != nil || others != 0 {
		t.Fatalf("%d rows of another tenant than the one sent (%v)", others, err)
	}
}

// nothingWritten fails t unless every table is empty.
func (e *badEnv) nothingWritten(t *testing.T) {
	t.Helper()
	if p, k, x := e.rows(t); p+k+x != 0 {
		t.Fatalf("%d payments, %d idempotency keys and %d effects written; want none", p, k, x)
	}
}

// wantRows fails t unless the tables hold exactly these numbers of rows.
func (e *badEnv) wantRows(t *testing.T, payments, keys, effects int) {
	t.Helper()
	if p, k, x := e.rows(t); p != payments || k != keys || x != effects {
		t.Fatalf("%d payments, %d idempotency keys, %d effects; want %d, %d, %d", p, k, x, payments, keys, effects)
	}
}

var payment = &paymentsv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 1250, Currency: "EUR"}

// create calls CreatePayment with the given metadata pairs.
func (e *badEnv) create(t *testing.T, req *paymentsv1.CreatePaymentRequest, kv ...string) (*paymentsv1.CreatePaymentResponse, metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	var header metadata.MD
	resp, err := e.payments.CreatePayment(metadata.NewOutgoingContext(ctx, metadata.Pairs(kv...)), req, grpc.Header(&header))
	return resp, header, err
}

// keyed returns the metadata pairs of a call under key for tenant.
func keyed(tenant, key string) []string {
	return []string{idem.KeyHeader, key, paymentsvc.TenantHeader, tenant}
}

// TestBadInput is a table of malformed and misused idempotency keys,
// tenants the key table cannot hold, recorded outcomes corrupted or
// relabelled in the table, and oversized requests, each over the wire to
// the payments service: its answer, and what it wrote (nothing, unless the
// row says otherwise).
func TestBadInput(t *testing.T) {
	t.Run("missing key where required", func(t *testing.T) {
		e := newBadEnv(t)
		_, _, err := e.create(t, payment, paymentsvc.TenantHeader, "acme")
		wantBadKey(t, err)
		e.nothingWritten(t)
	})
	t.Run("empty key", func(t *testing.T) {
		e := newBadEnv(t)
		_, _, err := e.create(t, payment, keyed("acme", "")...)
		wantBadKey(t, err)
		e.nothingWritten(t)
	})
	t.Run("256-byte key", func(t *testing.T) {
		e := newBadEnv(t)
		_, _, err := e.create(t, payment, keyed("acme", strings.Repeat("k", 256))...)
		wantBadKey(t, err)
		e.nothingWritten(t)
	})
	t.Run("255-byte key is the longest accepted", func(t *testing.T) {
		e := newBadEnv(t)
		if _, _, err := e.create(t, payment, keyed("acme", strings.Repeat("k", 255))...); err != nil {
			t.Fatal(err)
		}
		e.wantRows(t, 1, 1, 0)
	})
	t.Run("two key values", func(t *testing.T) {
		e := newBadEnv(t)
		_, _, err := e.create(t, payment, idem.KeyHeader, "a", idem.KeyHeader, "b", paymentsvc.TenantHeader, "acme")
		wantBadKey(t, err)
		e.nothingWritten(t)
	})
	// gRPC clients refuse to send the next keys; HTTP/2 carries them.
	for name, key := range map[string]string{
		"non-ASCII key":            "ключ-1",
		"control character (tab)":  "a\tb",
		"non-ASCII and space":      "über key",
		"Latin-1 byte, not UTF-8":  "caf\xe9",
		"control character at end": "key\t",
	} {
		t.Run(name, func(t *testing.T) {
			e := newBadEnv(t)
			st, err := h2Call(e.addr, "acme", key, payment)
			if err != nil {
				t.Fatal(err)
			}
			wantBadKey(t, st.Err())
			e.nothingWritten(t)
		})
	}
	// HTTP/2 itself forbids the other control characters in a header
	// value: the server resets the stream before idem sees the request.
	for name, key := range map[string]string{
		"control character (newline)": "a\nb",
		"control character (NUL)":     "a\x00b",
		"control character (DEL)":     "a\x7fb",
		"control character (CR)":      "a\rb",
	} {
		t.Run(name, func(t *testing.T) {
			e := newBadEnv(t)
			if err := h2Reset(e.addr, key, payment); err != nil {
				t.Fatal(err)
			}
			e.nothingWritten(t)
			// The server still serves.
			if _, _, err := e.create(t, payment, keyed("acme", "after")...); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("key reused with another body", func(t *testing.T) {
		e := newBadEnv(t)
		first, _, err := e.create(t, payment, keyed("acme", "k")...)
		if err != nil {
			t.Fatal(err)
		}
		var hash []byte
		e.pool.QueryRow(context.Background(), `SELECT request_hash FROM idempotency_keys`).Scan(&hash)
		other := proto.Clone(payment).(*paymentsv1.CreatePaymentRequest)
		other.AmountCents++
		resp, _, err := e.create(t, other, keyed("acme", "k")...)
		st := wantCode(t, err, codes.FailedPrecondition)
		if info := errorInfo(st); info.GetReason() != idem.ReasonKeyReused || resp != nil {
			t.Fatalf("ErrorInfo %v and response %v; want %s and no response", info, resp, idem.ReasonKeyReused)
		}
		e.wantRows(t, 1, 1, 0)
		var amount int64
		var after []byte
		err = e.pool.QueryRow(context.Background(), `SELECT p.amount_cents, k.request_hash FROM payments p, idempotency_keys k`).Scan(&amount, &after)
		if err != nil || amount != payment.AmountCents || !bytes.Equal(after, hash) {
			t.Fatalf("after the reuse: amount %d, hash changed %v (%v); want the first request's", amount, !bytes.Equal(after, hash), err)
		}
		again, header, err := e.create(t, payment, keyed("acme", "k")...)
		if err != nil || again.GetPayment().GetId() != first.GetPayment().GetId() || !replayed(header) {
			t.Fatalf("the first body again: %v, %v; want the replay of %s", again, err, first.GetPayment().GetId())
		}
	})
	t.Run("key reused across methods", func(t *testing.T) {
		e := newBadEnv(t)
		md := metadata.Pairs(keyed("acme", "k")...)
		created, _, err := e.create(t, payment, keyed("acme", "k")...)
		if err != nil {
			t.Fatal(err)
		}
		// Another method, another body, the same key: an operation of its
		// own, neither a replay nor a reuse.
		var header metadata.MD
		done, err := e.test.Do(metadata.NewOutgoingContext(context.Background(), md), &testv1.DoRequest{Value: "v"}, grpc.Header(&header))
		if err != nil || done.GetValue() != "v" || replayed(header) {
			t.Fatalf("Do under CreatePayment's key: %v, %v (replayed %v); want a fresh execution", done, err, replayed(header))
		}
		e.wantRows(t, 1, 2, 1)
		var methods []string
		rows, _ := e.pool.Query(context.Background(), `SELECT method FROM idempotency_keys WHERE key = 'k' ORDER BY method`)
		for rows.Next() {
			var m string
			rows.Scan(&m)
			methods = append(methods, m)
		}
		if want := []string{testv1.TestService_Do_FullMethodName, paymentsv1.PaymentService_CreatePayment_FullMethodName}; !slices.Equal(methods, want) {
			t.Fatalf("keys recorded for methods %v, want %v", methods, want)
		}
		// Each replays its own outcome.
		again, header, err := e.create(t, payment, keyed("acme", "k")...)
		if err != nil || again.GetPayment().GetId() != created.GetPayment().GetId() || !replayed(header) {
			t.Fatalf("CreatePayment retry: %v, %v", again, err)
		}
		if _, err := e.test.Do(metadata.NewOutgoingContext(context.Background(), md), &testv1.DoRequest{Value: "v"}, grpc.Header(&header)); err != nil || !replayed(header) {
			t.Fatalf("Do retry: %v (replayed %v)", err, replayed(header))
		}
		e.wantRows(t, 1, 2, 1)
	})
	t.Run("same key across tenants", func(t *testing.T) {
		e := newBadEnv(t)
		acme, _, err := e.create(t, payment, keyed("acme", "k")...)
		if err != nil {
			t.Fatal(err)
		}
		globex, header, err := e.create(t, payment, keyed("globex", "k")...)
		if err != nil || replayed(header) || globex.GetPayment().GetId() == acme.GetPayment().GetId() {
			t.Fatalf("globex under acme's key: %v, %v (replayed %v); want a payment of its own", globex, err, replayed(header))
		}
		e.wantRows(t, 2, 2, 0)
		var n int
		e.pool.QueryRow(context.Background(), `SELECT count(DISTINCT tenant_id) FROM payments`).Scan(&n)
		if n != 2 {
			t.Fatalf("payments of %d tenants, want 2", n)
		}
		for tenant, want := range map[string]string{"acme": acme.GetPayment().GetId(), "globex": globex.GetPayment().GetId()} {
			again, header, err := e.create(t, payment, keyed(tenant, "k")...)
			if err != nil || again.GetPayment().GetId() != want || !replayed(header) {
				t.Fatalf("%s retry: %v, %v; want the replay of %s", tenant, again, err, want)
			}
		}
		e.wantRows(t, 2, 2, 0)
	})
	t.Run("255-byte tenant is the longest accepted", func(t *testing.T) {
		e := newBadEnv(t)
		tenant := strings.Repeat("t", store.MaxTenantLength)
		first, _, err := e.create(t, payment, keyed(tenant, "k")...)
		if err != nil {
			t.Fatal(err)
		}
		again, header, err := e.create(t, payment, keyed(tenant, "k")...)
		if err != nil || again.GetPayment().GetId() != first.GetPayment().GetId() || !replayed(header) {
			t.Fatalf("retry: %v, %v; want the replay of %s", again, err, first.GetPayment().GetId())
		}
		e.wantRows(t, 1, 1, 0)
		e.wantTenant(t, tenant)
	})
	for name, tenant := range map[string]string{
		"256-byte tenant":         strings.Repeat("t", store.MaxTenantLength+1),
		"10 KB tenant (random)":   randomHex(5 << 10),
		"10 KB tenant (repeated)": strings.Repeat("acme", 10<<10/4),
	} {
		t.Run(name, func(t *testing.T) {
			e := newBadEnv(t)
			for range 2 { // the same answer on a retry: nothing to wait for
				_, _, err := e.create(t, payment, keyed(tenant, "k")...)
				wantScopeInvalid(t, err, fmt.Sprint(len(tenant)))
			}
			e.nothingWritten(t)
		})
	}
	// gRPC clients refuse to send the next tenants; HTTP/2 carries them.
	for name, tenant := range map[string]string{
		"tenant not UTF-8":          "bad-\xff\xfe",
		"Latin-1 tenant, not UTF-8": "Z\xfcrich",
	} {
		t.Run(name, func(t *testing.T) {
			e := newBadEnv(t)
			st, err := h2Call(e.addr, tenant, "k", payment)
			if err != nil {
				t.Fatal(err)
			}
			wantScopeInvalid(t, st.Err(), "UTF-8")
			e.nothingWritten(t)
		})
	}
	t.Run("non-ASCII UTF-8 tenant", func(t *testing.T) {
		e := newBadEnv(t)
		for range 2 {
			st, err := h2Call(e.addr, "Zürich-東京", "k", payment)
			if err != nil || st.Code() != codes.OK {
				t.Fatalf("call: %v, %v; want OK", st.Proto(), err)
			}
		}
		e.wantRows(t, 1, 1, 0)
		e.wantTenant(t, "Zürich-東京")
	})
	for name, corrupt := range map[string]string{
		"corrupt stored response (garbage)":    `UPDATE idempotency_keys SET response = '\xff'`,
		"corrupt stored response (truncated)":  `UPDATE idempotency_keys SET response = substring(response FROM 1 FOR length(response) - 3)`,
		"corrupt stored response (wrong type)": `UPDATE idempotency_keys SET response = '\x0a0548656c6c6f'`,
		"corrupt stored response (a flipped byte)": `UPDATE idempotency_keys
			SET response = set_byte(response, length(response) - 1, get_byte(response, length(response) - 1) # 1)`,
		"stored response with code 99":      `UPDATE idempotency_keys SET response_code = 99`,
		"stored error whose code disagrees": `UPDATE idempotency_keys SET response_code = 5`,
		"stored error relabelled OK":        `UPDATE idempotency_keys SET response_code = 0`,
		"stored error with code 99":         `UPDATE idempotency_keys SET response_code = 99`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newBadEnv(t)
			req := payment
			if strings.Contains(name, "error") {
				// A recorded validation error.
				req = &paymentsv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: -1, Currency: "EUR"}
				if _, _, err := e.create(t, req, keyed("acme", "k")...); status.Code(err) != codes.InvalidArgument {
					t.Fatalf("invalid payment: %v", err)
				}
			} else if _, _, err := e.create(t, req, keyed("acme", "k")...); err != nil {
				t.Fatal(err)
			}
			if _, err := e.pool.Exec(context.Background(), corrupt); err != nil {
				t.Fatal(err)
			}
			logged := idemLog.count("cannot be replayed")
			resp, header, err := e.create(t, req, keyed("acme", "k")...)
			wantCode(t, err, codes.Internal)
			if resp != nil || replayed(header) {
				t.Fatalf("a corrupt record replayed %v (header %v)", resp, header)
			}
			if idemLog.count("cannot be replayed") <= logged {
				t.Fatal("the unreadable record was not logged")
			}
			p, k, _ := e.rows(t)
			if k != 1 || p != 0 && strings.Contains(name, "error") || p != 1 && !strings.Contains(name, "error") {
				t.Fatalf("%d payments, %d keys after replaying a corrupt record", p, k)
			}
			// No panic took the server down: it serves other keys.
			if _, _, err := e.create(t, payment, keyed("acme", "k2")...); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("record that writes no row", func(t *testing.T) {
		// A BEFORE INSERT OR UPDATE trigger that returns NULL (or a
		// row-level security policy that hides the row) keeps the
		// outcome from being recorded. Nothing may commit then: not the
		// payment, and not a key left in progress that would answer
		// IDEMPOTENCY_KEY_IN_USE to every retry until it expires.
		e := newBadEnv(t)
		ctx := context.Background()
		if _, err := e.pool.Exec(ctx, `
CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER skip_write BEFORE INSERT OR UPDATE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION skip_row()`); err != nil {
			t.Fatal(err)
		}
		_, _, err := e.create(t, payment, keyed("acme", "k")...)
		wantCode(t, err, codes.Unavailable) // retry this call
		e.nothingWritten(t)

		if _, err := e.pool.Exec(ctx, `DROP TRIGGER skip_write ON idempotency_keys`); err != nil {
			t.Fatal(err)
		}
		resp, header, err := e.create(t, payment, keyed("acme", "k")...)
		if err != nil || replayed(header) {
			t.Fatalf("retry after the trigger was dropped: %v (replayed %v); want a fresh execution", err, replayed(header))
		}
		e.wantRows(t, 1, 1, 0)
		var id string
		if err := e.pool.QueryRow(ctx, `SELECT id::text FROM payments`).Scan(&id); err != nil || id != resp.GetPayment().GetId() {
			t.Fatalf("payments row %q (%v), answered %q", id, err, resp.GetPayment().GetId())
		}
	})
	t.Run("request larger than any cap", func(t *testing.T) {
		e := newBadEnv(t)
		big := proto.Clone(payment).(*paymentsv1.CreatePaymentRequest)
		big.Note = strings.Repeat("x", 5<<20) // gRPC servers take 4 MiB by default
		_, _, err := e.create(t, big, keyed("acme", "big")...)
		wantCode(t, err, codes.ResourceExhausted)
		e.nothingWritten(t)
	})
}

func replayed(header metadata.MD) bool {
	return slices.Contains(header.Get(idem.ReplayedHeader), "true")
}

// wantCode fails t unless err carries code c.
func wantCode(t *testing.T, err error, c codes.Code) *status.Status {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != c {
		t.Fatalf("got %v, want code %v", err, c)
	}
	return st
}

// wantScopeInvalid fails t unless err is INVALID_ARGUMENT with ErrorInfo
// reason IDEMPOTENCY_SCOPE_INVALID and a short message that names the
// tenant and contains rule.
func wantScopeInvalid(t *testing.T, err error, rule string) {
	t.Helper()
	st := wantCode(t, err, codes.InvalidArgument)
	if info := errorInfo(st); info.GetReason() != idem.ReasonScopeInvalid || info.GetDomain() != idem.Domain {
		t.Fatalf("ErrorInfo %v, want reason %s", info, idem.ReasonScopeInvalid)
	}
	if msg := st.Message(); !strings.Contains(msg, "tenant") || !strings.Contains(msg, rule) || len(msg) > 200 {
		t.Fatalf("message %q: want a short one naming the tenant and %q", msg, rule)
	}
}

// wantBadKey fails t unless err is INVALID_ARGUMENT with a BadRequest
// violation on the idempotency-key header.
func wantBadKey(t *testing.T, err error) {
	t.Helper()
	st := wantCode(t, err, codes.InvalidArgument)
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if v.GetField() == idem.KeyHeader {
					return
				}
			}
		}
	}
	t.Fatalf("no BadRequest violation on %s in %v", idem.KeyHeader, st.Proto())
}

func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// grpcMessage frames a request as gRPC does on the wire: an uncompressed
// flag, the length, the message.
func grpcMessage(req proto.Message) []byte {
	b, err := proto.Marshal(req)
	if err != nil {
		panic(err)
	}
	frame := []byte{0}
	frame = be.BigEndian.AppendUint32(frame, uint32(len(b)))
	return append(frame, b...)
}

// h2Call sends CreatePayment for tenant under key over HTTP/2 without a
// gRPC client, which would refuse a key or tenant that is not printable
// ASCII, and returns the gRPC status the server answered with.
func h2Call(addr, tenant, key string, req proto.Message) (*status.Status, error) {
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: protocols}, Timeout: attemptTimeout}
	hreq, err := http.NewRequest(http.MethodPost, "http://"+addr+paymentsv1.PaymentService_CreatePayment_FullMethodName,
		bytes.NewReader(grpcMessage(req)))
	if err != nil {
		return nil, err
	}
	hreq.Header["content-type"] = []string{"application/grpc"}
	hreq.Header["te"] = []string{"trailers"}
	hreq.Header[idem.KeyHeader] = []string{key}
	hreq.Header[paymentsvc.TenantHeader] = []string{tenant}
	resp, err := client.Do(hreq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err != nil {
		return nil, err
	}
	// An error without a response message comes in the headers alone.
	get := func(k string) string {
		if v := resp.Trailer.Get(k); v != "" {
			return v
		}
		return resp.Header.Get(k)
	}
	if get("grpc-status") == "" {
		return nil, fmt.Errorf("no grpc-status in the answer: HTTP %s, header %v, trailer %v", resp.Status, resp.Header, resp.Trailer)
	}
	if get("grpc-status-details-bin") == "" {
		code, err := strconv.Atoi(get("grpc-status"))
		if err != nil {
			return nil, fmt.Errorf("grpc-status %q: %w", get("grpc-status"), err)
		}
		msg, err := url.PathUnescape(get("grpc-message"))
		if err != nil {
			return nil, fmt.Errorf("grpc-message %q: %w", get("grpc-message"), err)
		}
		return status.New(codes.Code(code), msg), nil
	}
	details, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(get("grpc-status-details-bin"), "="))
	if err != nil {
		return nil, fmt.Errorf("grpc-status-details-bin: %w", err)
	}
	st := new(spb.Status)
	if err := proto.Unmarshal(details, st); err != nil {
		return nil, fmt.Errorf("grpc-status-details-bin: %w", err)
	}
	if fmt.Sprint(st.GetCode()) != get("grpc-status") {
		return nil, fmt.Errorf("grpc-status %s, but details of code %d", get("grpc-status"), st.GetCode())
	}
	return status.FromProto(st), nil
}

// h2Reset sends CreatePayment under key over HTTP/2 frames written by hand,
// since no HTTP/2 library sends a header value HTTP/2 forbids, and checks
// that the server resets the stream (or the connection) instead of
// answering.
func h2Reset(addr, key string, req proto.Message) error {
	conn, err := net.DialTimeout("tcp", addr, attemptTimeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(attemptTimeout))

	// HPACK literals without indexing or Huffman coding (RFC 7541, 6.2.2).
	var block []byte
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", paymentsv1.PaymentService_CreatePayment_FullMethodName},
		{"content-type", "application/grpc"}, {"te", "trailers"},
		{paymentsvc.TenantHeader, "acme"}, {idem.KeyHeader, key},
	} {
		block = append(block, 0)
		block = hpackString(block, f[0])
		block = hpackString(block, f[1])
	}
	msg := grpcMessage(req)
	var out []byte
	out = append(out, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"...)
	out = h2Frame(out, 0x4, 0, 0, nil)     // SETTINGS
	out = h2Frame(out, 0x1, 0x4, 1, block) // HEADERS, END_HEADERS
	out = h2Frame(out, 0x0, 0x1, 1, msg)   // DATA, END_STREAM
	if _, err := conn.Write(out); err != nil {
		return err
	}
	for {
		var head [9]byte
		if _, err := io.ReadFull(conn, head[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil // the server closed the connection
			}
			return fmt.Errorf("waiting for the reset: %w", err)
		}
		length := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
		typ, flags := head[3], head[4]
		stream := be.BigEndian.Uint32(head[5:]) & 0x7fffffff
		payload := make([]byte, length)
		if _, err := io.ReadFull(conn, payload); err != nil {
			return err
		}
		switch {
		case typ == 0x4 && flags&0x1 == 0: // SETTINGS: acknowledge
			if _, err := conn.Write(h2Frame(nil, 0x4, 0x1, 0, nil)); err != nil {
				return err
			}
		case typ == 0x3 && stream == 1: // RST_STREAM
			if code := be.BigEndian.Uint32(payload); code != 0x1 {
				return fmt.Errorf("stream reset with error code %#x, want PROTOCOL_ERROR", code)
			}
			return nil
		case typ == 0x7: // GOAWAY
			return nil
		case stream == 1: // HEADERS or DATA: the server answered
			return fmt.Errorf("the server answered a request with key %q (frame type %#x)", key, typ)
		}
	}
}

// h2Frame appends an HTTP/2 frame.
func h2Frame(b []byte, typ, flags byte, stream uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	b = be.BigEndian.AppendUint32(b, stream)
	return append(b, payload...)
}

// hpackString appends s as an HPACK string literal without Huffman coding.
func hpackString(b []byte, s string) []byte {
	// A 7-bit prefix integer (RFC 7541, 5.1).
	n := len(s)
	if n < 127 {
		b = append(b, byte(n))
	} else {
		b = append(b, 127)
		for n -= 127; n >= 128; n >>= 7 {
			b = append(b, byte(n%128+128))
		}
		b = append(b, byte(n))
	}
	return append(b, s...)
}
