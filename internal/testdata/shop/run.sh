#!/usr/bin/env bash
# Plays a buf user's first day with idem, in a fresh copy of this module
# outside idem's tree: export idem's options proto from the Go module into
# the buf workspace, generate with managed mode on, and run a server whose
# keyed method must be read from shop.proto at run time, with duplicate
# protobuf registrations made fatal. Then show the module graph idem adds.
# .ci/run runs it; it needs the Go module proxy.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -R "$(dirname "$0")/." "$work"
rm "$work/run.sh"
cd "$work"

# In a real module: go get github.com/idemkit/idem@latest, and in tools/
# go get -tool github.com/idemkit/idem/cmd/buf-plugin-idem@latest for the
# lint rule buf.yaml names. Here both come from the repository under test.
go mod edit -require=github.com/idemkit/idem@v0.0.0 -replace=github.com/idemkit/idem="$repo"
plugin=github.com/idemkit/idem/cmd/buf-plugin-idem
(cd tools &&
	go mod edit -require="$plugin@v0.0.0" -replace="$plugin=$repo/cmd/buf-plugin-idem" -tool="$plugin" &&
	go mod tidy)

idem_dir=$(go list -m -f '{{.Dir}}' github.com/idemkit/idem)
go tool buf export "$idem_dir/proto" -o third_party/idem
go tool buf lint
# The lint fails on a method that looks mutating and says nothing about
# retries, at the method's line.
cat >proto/shop/v1/refund.proto <<'PROTO'
syntax = "proto3";

package shop.v1;

// RefundService refunds orders.
service RefundService {
  // RefundOrder refunds an order.
  rpc RefundOrder(RefundOrderRequest) returns (RefundOrderResponse);
}

// RefundOrderRequest names the order.
message RefundOrderRequest {
  // order_id is the order to refund.
  string order_id = 1;
}

// RefundOrderResponse is empty.
message RefundOrderResponse {}
PROTO
if go tool buf lint --path proto/shop/v1/refund.proto >lint.txt; then
	echo "buf lint passed a mutating method without (idem.v1.method)" >&2
	exit 1
fi
cat lint.txt
[ "$(wc -l <lint.txt)" -eq 1 ]
grep -q '^proto/shop/v1/refund.proto:8:3:shop.v1.RefundService.RefundOrder looks mutating' lint.txt
rm proto/shop/v1/refund.proto lint.txt
go tool buf generate
go mod tidy

GOLANG_PROTOBUF_REGISTRATION_CONFLICT=panic go run ./server

echo "--- go list -m all of a module that imports idem"
GOWORK=off go list -m all
# What idem itself requires (its edges in the module graph) must be what
# the library imports: grpc, protobuf, genproto's rpc types, pgx,
# go-grpc-middleware, uuid, connect-go (for interceptor/idemconnect; it
# requires only protobuf and go-cmp) and their dependencies. Nothing of the
# examples (NATS, OpenTelemetry's SDK), of the grpc-gateway adapter
# (grpc-gateway) or of the tools (buf, with connect-go v2 and otelconnect).
echo "--- what idem requires"
GOWORK=off go mod graph | awk '$1 ~ /^github.com\/idemkit\/idem@/ {print $2}' | tee requires.txt
if grep -v -E '^connectrpc\.com/connect@' requires.txt |
	grep -E 'nats-io|go.opentelemetry.io/otel/sdk|go.opentelemetry.io/otel/exporters|bufbuild|connectrpc|grpc-gateway'; then
	echo "idem requires modules that only its examples, its grpc-gateway adapter or its tools need" >&2
	exit 1
fi
