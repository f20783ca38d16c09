package main

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/internal/pgtest"
)

// tenantOn returns a tenant that paymentsvc.ShardOf sends to shard i of n.
func tenantOn(t *testing.T, i, n int) string {
	t.Helper()
	for c := range 1000 {
		if tenant := fmt.Sprintf("tenant-%d", c); paymentsvc.ShardOf(tenant, n) == i {
			return tenant
		}
	}
	t.Fatalf("no tenant of the first 1000 lands on shard %d of %d", i, n)
	return ""
}

// TestServerShards runs the server on two shard databases and calls it over
// the wire as two tenants, one on each shard, with the same idempotency
// key: each tenant's payment and key land on its own shard only, retries
// replay, and reads find each tenant's payment on its shard.
func TestServerShards(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t), pgtest.NewDatabase(t)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, lis, nil, nil, dsns...)

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, callCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer callCancel()
	if _, err := healthpb.NewHealthClient(conn).Check(callCtx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}

	client := paymentsv1.NewPaymentServiceClient(conn)
	tenants := []string{tenantOn(t, 0, 2), tenantOn(t, 1, 2)}
	ids := make([]string, 2)
	for i, tenant := range tenants {
		keyed := metadata.AppendToOutgoingContext(callCtx, idem.KeyHeader, "pay-1", paymentsvc.TenantHeader, tenant)
		req := &paymentsv1.CreatePaymentRequest{CustomerId: "c-" + tenant, AmountCents: int64(100 + i), Currency: "EUR"}
		first, err := client.CreatePayment(keyed, req)
		if err != nil {
			t.Fatalf("%s: %v", tenant, err)
		}
		var header metadata.MD
		again, err := client.CreatePayment(keyed, req, grpc.Header(&header))
		if err != nil || again.GetPayment().GetId() != first.GetPayment().GetId() || len(header.Get(idem.ReplayedHeader)) != 1 {
			t.Fatalf("%s's retry: %v, %v (header %v); want a replay of payment %s", tenant, again, err, header, first.GetPayment().GetId())
		}
		ids[i] = first.GetPayment().GetId()
	}
	// Each tenant reads its payment from its shard, and never another's.
	for i, tenant := range tenants {
		asTenant := metadata.AppendToOutgoingContext(callCtx, paymentsvc.TenantHeader, tenant)
		got, err := client.GetPayment(asTenant, &paymentsv1.GetPaymentRequest{Id: ids[i]})
		if err != nil || got.GetPayment().GetCustomerId() != "c-"+tenant {
			t.Errorf("%s reads its payment: %v, %v", tenant, got, err)
		}
		if _, err := client.GetPayment(asTenant, &paymentsv1.GetPaymentRequest{Id: ids[1-i]}); status.Code(err) != codes.NotFound {
			t.Errorf("%s reads the other tenant's payment: %v, want NOT_FOUND", tenant, err)
		}
	}

	// The databases are the judge: each tenant's rows on its shard only.
	for i, dsn := range dsns {
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		for j, tenant := range tenants {
			want := 0
			if i == j {
				want = 1
			}
			var payments, keys int
			if err := pool.QueryRow(callCtx, `SELECT
    (SELECT count(*) FROM payments WHERE tenant_id = $1 AND id::text = $2),
    (SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND key = 'pay-1' AND status = 'recorded')`,
				tenant, ids[j]).Scan(&payments, &keys); err != nil {
				t.Fatal(err)
			}
			if payments != want || keys != want {
				t.Errorf("shard %d holds %d payments and %d keys of %s (on shard %d), want %d and %d", i, payments, keys, tenant, j, want, want)
			}
		}
		var all int
		if err := pool.QueryRow(callCtx, `SELECT (SELECT count(*) FROM payments) + (SELECT count(*) FROM idempotency_keys)`).Scan(&all); err != nil || all != 2 {
			t.Errorf("shard %d holds %d rows in all, %v; want its tenant's payment and key", i, all, err)
		}
	}
}
