#!/usr/bin/env bash
# Plays a buf user's first day with idem, from docs/buf.md's own text, in a
# fresh copy of this module outside idem's tree: pin buf and the protoc
# plugins in a tools module as that page's recipe does (run from the page,
# so the two cannot drift), export idem's options and Google's
# google.api.http annotations into the buf workspace, lint, generate gRPC,
# Connect and grpc-gateway code with managed mode on, and run the module's
# tests with duplicate protobuf registrations made fatal: a handler test on
# pgtest, and a server that serves each wire with idem and must replay each
# retry. Then check that go doc and go list -m all work in the module, and
# show the module graph idem adds. .ci/run runs it; it needs the Go module
# proxy (or a module cache that holds what the recipe pins) and PostgreSQL
# as pgtest finds it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -R "$(dirname "$0")/." "$work"
rm "$work/run.sh"
cd "$work"

# readme NAME prints docs/buf.md's code block that follows the line
# "<!-- shop: NAME -->".
readme() {
	awk -v mark="<!-- shop: $1 -->" '
		$0 == mark { found = 1; next }
		found && /^```/ { if (inside) exit; inside = 1; next }
		inside { print }' "$repo/docs/buf.md"
}
# readme_run NAME runs docs/buf.md's shell block NAME as it is written.
readme_run() {
	local script
	script=$(readme "$1")
	if [ -z "$script" ]; then
		echo "docs/buf.md has no block after <!-- shop: $1 -->" >&2
		exit 1
	fi
	printf '+ %s\n' "$script"
	bash -euo pipefail -c "$script"
}
# This module's buf.yaml and buf.gen.yaml are docs/buf.md's.
for f in buf.yaml buf.gen.yaml; do
	if ! diff -u <(readme "$f") "$f"; then
		echo "internal/testdata/shop/$f differs from docs/buf.md's (after <!-- shop: $f -->); make them one" >&2
		exit 1
	fi
done

# In a real module: go get github.com/idemkit/idem and
# github.com/idemkit/idem/interceptor/idemgateway. Here both come from the
# repository under test.
go mod edit -require=github.com/idemkit/idem@v0.0.0 -replace=github.com/idemkit/idem="$repo" \
	-require=github.com/idemkit/idem/interceptor/idemgateway@v0.0.0 \
	-replace=github.com/idemkit/idem/interceptor/idemgateway="$repo/interceptor/idemgateway"

# docs/buf.md's tools module: buf and the plugins, outside the module and
# outside any go.work. Then the lint plugin, which docs/buf.md pins with
# go get -tool github.com/idemkit/idem/cmd/buf-plugin-idem; here it comes
# from the repository under test.
readme_run tools
plugin=github.com/idemkit/idem/cmd/buf-plugin-idem
(cd tools &&
	go mod edit -require="$plugin@v0.0.0" -replace="$plugin=$repo/cmd/buf-plugin-idem" -tool="$plugin" &&
	GOWORK=off go mod tidy)
buf() { GOWORK=off go tool -modfile=tools/go.mod buf "$@"; }

# idem's options, from the Go module, and Google's annotations, from
# docs/buf.md's recipe.
idem=$(go list -m -f '{{.Dir}}' github.com/idemkit/idem)
buf export "$idem/proto" --path "$idem/proto/idem/v1/options.proto" -o third_party/idem
readme_run googleapis
buf lint
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
if buf lint --path proto/shop/v1/refund.proto >lint.txt; then
	echo "buf lint passed a mutating method without (idem.v1.method)" >&2
	exit 1
fi
cat lint.txt
[ "$(wc -l <lint.txt)" -eq 1 ]
grep -q '^proto/shop/v1/refund.proto:8:3:shop.v1.RefundService.RefundOrder looks mutating' lint.txt
rm proto/shop/v1/refund.proto lint.txt
buf generate
go mod tidy

# protoc-gen-go is the protobuf runtime the service builds with, and
# protoc-gen-connect-go and protoc-gen-grpc-gateway the versions of their
# runtimes: the recipe pins what idem requires.
for m in google.golang.org/protobuf connectrpc.com/connect github.com/grpc-ecosystem/grpc-gateway/v2; do
	tool=$(GOWORK=off go list -modfile=tools/go.mod -m -f '{{.Version}}' "$m")
	service=$(go list -m -f '{{.Version}}' "$m")
	if [ "$tool" != "$service" ]; then
		echo "docs/buf.md's recipe pins $m $tool, but the service builds with $service: pin $service" >&2
		exit 1
	fi
done

go vet ./...
GOLANG_PROTOBUF_REGISTRATION_CONFLICT=panic go test -count=1 ./...

# No go.work joins the tools: go doc and go list -m all work in the module
# as a user runs them, and buf is not in its module graph. (grpc-gateway's
# go.mod brings buf.build/go/protovalidate into it, tools or not.)
if [ -n "$(go env GOWORK)" ]; then
	echo "the module is in a workspace ($(go env GOWORK)); docs/buf.md's recipe makes none" >&2
	exit 1
fi
go doc github.com/idemkit/idem/store/postgres/pgtest.NewPool >/dev/null
echo "--- go list -m all of a module that imports idem"
go list -m all | tee modules.txt
if grep -E '^(github\.com/bufbuild/buf|connectrpc\.com/connect/v2|connectrpc\.com/otelconnect) ' modules.txt; then
	echo "buf is in the service's module graph" >&2
	exit 1
fi

# What idem requires (its edges in the module graph) must be what the
# library imports: grpc, protobuf, genproto's rpc types, pgx,
# go-grpc-middleware, uuid, connect-go (for interceptor/idemconnect; it
# requires only protobuf and go-cmp) and their dependencies. Nothing of the
# examples (NATS, OpenTelemetry's SDK), of the grpc-gateway adapter
# (grpc-gateway) or of the tools (buf, with connect-go v2 and otelconnect).
echo "--- what idem requires"
go mod graph | awk '$1 ~ /^github.com\/idemkit\/idem@/ {print $2}' | tee requires.txt
if grep -v -E '^connectrpc\.com/connect@' requires.txt |
	grep -E 'nats-io|go.opentelemetry.io/otel/sdk|go.opentelemetry.io/otel/exporters|bufbuild|connectrpc|grpc-gateway'; then
	echo "idem requires modules that only its examples, its grpc-gateway adapter or its tools need" >&2
	exit 1
fi
