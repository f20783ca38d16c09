package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/postgres/pgtest"

	shopv1 "example.com/shop/gen/shop/v1"
	"example.com/shop/gen/shop/v1/shopv1connect"
)

// call places an order over one wire under key, and returns the order's id
// and whether the answer was a replay.
type call func(ctx context.Context, key string, req *shopv1.PlaceOrderRequest) (id string, replayed bool, err error)

// TestWires serves gRPC, Connect and HTTP/JSON as main does, calls each with
// a key and retries the call: the retry is a replay, and each key wrote one
// order, whatever wire its call and its retry took.
func TestWires(t *testing.T) {
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(t.Context(), schema); err != nil {
		t.Fatal(err)
	}
	glis, hlis := listen(t), listen(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, pool, glis, hlis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	conn, err := grpc.NewClient(glis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	grpcClient := shopv1.NewShopServiceClient(conn)
	base := "http://" + hlis.Addr().String()
	connectClient := shopv1connect.NewShopServiceClient(http.DefaultClient, base)

	wires := map[string]call{
		"grpc": func(ctx context.Context, key string, req *shopv1.PlaceOrderRequest) (string, bool, error) {
			var header metadata.MD
			ctx = metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, key)
			res, err := grpcClient.PlaceOrder(ctx, req, grpc.Header(&header))
			replayed := header.Get(idem.ReplayedHeader)
			return res.GetOrderId(), len(replayed) == 1 && replayed[0] == "true", err
		},
		"connect": func(ctx context.Context, key string, req *shopv1.PlaceOrderRequest) (string, bool, error) {
			ctx, info := connect.NewClientContext(ctx)
			info.RequestHeader().Set(idem.HTTPKeyHeader, `"`+key+`"`)
			res, err := connectClient.PlaceOrder(ctx, req)
			return res.GetOrderId(), info.ResponseHeader().Get(idem.HTTPReplayedHeader) == "true", err
		},
		"http": func(ctx context.Context, key string, req *shopv1.PlaceOrderRequest) (string, bool, error) {
			body, err := protojson.Marshal(req)
			if err != nil {
				return "", false, err
			}
			hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/orders", bytes.NewReader(body))
			if err != nil {
				return "", false, err
			}
			hreq.Header.Set("Content-Type", "application/json")
			hreq.Header.Set(idem.HTTPKeyHeader, `"`+key+`"`)
			hres, err := http.DefaultClient.Do(hreq)
			if err != nil {
				return "", false, err
			}
			defer hres.Body.Close()
			b, err := io.ReadAll(hres.Body)
			if err != nil {
				return "", false, err
			}
			if hres.StatusCode != http.StatusOK {
				return "", false, fmt.Errorf("%s: %s", hres.Status, b)
			}
			var res shopv1.PlaceOrderResponse
			if err := protojson.Unmarshal(b, &res); err != nil {
				return "", false, err
			}
			return res.GetOrderId(), hres.Header.Get(idem.HTTPReplayedHeader) == "true", nil
		},
	}

	orders := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	want := 0
	for _, pair := range [][2]string{
		{"grpc", "grpc"}, {"connect", "connect"}, {"http", "http"},
		{"grpc", "http"}, {"http", "connect"}, {"connect", "grpc"},
	} {
		key := "order-" + pair[0] + "-" + pair[1]
		// trace_id is left out of the fingerprint (shop.proto), so the
		// retry, with another trace_id, is the same request.
		first, replayed, err := wires[pair[0]](t.Context(), key, &shopv1.PlaceOrderRequest{Sku: "book", TraceId: "a"})
		if err != nil || replayed {
			t.Fatalf("%s call with key %s: replayed %v, error %v; want a first execution", pair[0], key, replayed, err)
		}
		retry, replayed, err := wires[pair[1]](t.Context(), key, &shopv1.PlaceOrderRequest{Sku: "book", TraceId: "b"})
		if err != nil || !replayed || retry != first {
			t.Fatalf("%s retry of a %s call: %q, replayed %v, error %v; want a replay of %q", pair[1], pair[0], retry, replayed, err, first)
		}
		if want++; orders() != want {
			t.Fatalf("after a %s call and its %s retry: %d orders, want %d", pair[0], pair[1], orders(), want)
		}
	}

	// key_required, read from shop.proto at run time: a call without a key
	// is refused and writes nothing.
	if _, err := grpcClient.PlaceOrder(t.Context(), &shopv1.PlaceOrderRequest{Sku: "book"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a call without a key got %v, want InvalidArgument", err)
	}
	if n := orders(); n != want {
		t.Fatalf("a refused call left %d orders, want %d", n, want)
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}
