package paymentsvc_test

import (
	"context"
	"net"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func newClient(t *testing.T) (paymentsv1.PaymentServiceClient, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.NewPool(t)
	if err := paymentsvc.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	srv, err := paymentsvc.NewServer(pool)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return paymentsv1.NewPaymentServiceClient(conn), pool
}

func call(tenant, key string) context.Context {
	md := metadata.MD{}
	if tenant != "" {
		md.Set(paymentsvc.TenantHeader, tenant)
	}
	if key != "" {
		md.Set(idem.KeyHeader, key)
	}
	return metadata.NewOutgoingContext(context.Background(), md)
}

func payments(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var valid = &paymentsv1.CreatePaymentRequest{CustomerId: "cus_1", AmountCents: 1250, Currency: "EUR", Note: "n", TraceId: "t1"}

func TestCreateAndGetPayment(t *testing.T) {
	client, pool := newClient(t)
	created, err := client.CreatePayment(call("acme", "k1"), valid)
	if err != nil {
		t.Fatal(err)
	}
	p := created.GetPayment()
	if p.GetId() == "" || p.GetCustomerId() != "cus_1" || p.GetAmountCents() != 1250 || p.GetCurrency() != "EUR" || p.GetCreateTime() == nil {
		t.Fatalf("created %v", p)
	}
	// A retry whose trace id changed is the same request.
	retry := proto.Clone(valid).(*paymentsv1.CreatePaymentRequest)
	retry.TraceId = "t2"
	again, err := client.CreatePayment(call("acme", "k1"), retry)
	if err != nil || !proto.Equal(again, created) {
		t.Fatalf("retry: %v, %v; want %v", again, err, created)
	}

	got, err := client.GetPayment(call("acme", ""), &paymentsv1.GetPaymentRequest{Id: p.GetId()})
	if err != nil || !proto.Equal(got.GetPayment(), p) {
		t.Fatalf("GetPayment: %v, %v; want %v", got, err, p)
	}
	// Another tenant cannot see it.
	_, err = client.GetPayment(call("globex", ""), &paymentsv1.GetPaymentRequest{Id: p.GetId()})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetPayment from another tenant: %v, want NotFound", err)
	}
	if n := payments(t, pool); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

func TestCreatePaymentRejections(t *testing.T) {
	client, pool := newClient(t)

	_, err := client.CreatePayment(call("acme", ""), valid)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("without a key: %v, want InvalidArgument", err)
	}
	_, err = client.CreatePayment(call("", "k"), valid)
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a tenant: %v, want Unauthenticated", err)
	}

	bad := &paymentsv1.CreatePaymentRequest{AmountCents: -5, Currency: "eur"}
	_, err = client.CreatePayment(call("acme", "k-bad"), bad)
	st := status.Convert(err)
	fields := map[string]bool{}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields[v.GetField()] = true
			}
		}
	}
	if st.Code() != codes.InvalidArgument || !fields["customer_id"] || !fields["amount_cents"] || !fields["currency"] {
		t.Fatalf("invalid payment: %v with violations on %v", st.Proto(), fields)
	}
	if n := payments(t, pool); n != 0 {
		t.Fatalf("%d payments after rejections, want 0", n)
	}
}

// TestBackstop shows the natural-key backstop: a payment stored for a key
// outside idem (here, directly) makes CreatePayment answer AlreadyExists
// instead of storing a second one.
func TestBackstop(t *testing.T) {
	client, pool := newClient(t)
	_, err := pool.Exec(context.Background(),
		`INSERT INTO payments (tenant_id, customer_id, amount_cents, currency, request_key)
		 VALUES ('acme', 'cus_1', 1250, 'EUR', 'k')`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.CreatePayment(call("acme", "k"), valid)
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreatePayment over an existing payment: %v, want AlreadyExists", err)
	}
	if n := payments(t, pool); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// TestStoreFailureCarriesRetryInfo: a payment the database refuses to
// store (here a trigger; in production a failover, a lost connection) is
// UNAVAILABLE with a RetryInfo, as idem's own storage failures are, and
// leaves neither a payment nor a key.
func TestStoreFailureCarriesRetryInfo(t *testing.T) {
	client, pool := newClient(t)
	_, err := pool.Exec(context.Background(), `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
		$$BEGIN RAISE EXCEPTION 'refused'; END$$;
		CREATE TRIGGER refuse BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION refuse()`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.CreatePayment(call("acme", "k-refused"), valid)
	st := status.Convert(err)
	var delay *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri
		}
	}
	if st.Code() != codes.Unavailable || delay.GetRetryDelay().AsDuration() <= 0 {
		t.Fatalf("a payment the database refused: %v, want UNAVAILABLE with a RetryInfo", st.Proto())
	}
	var keys int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if n := payments(t, pool); n != 0 || keys != 0 {
		t.Fatalf("%d payments and %d keys after the refusal, want none", n, keys)
	}
}
