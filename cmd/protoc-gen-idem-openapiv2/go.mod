module github.com/idemkit/idem/cmd/protoc-gen-idem-openapiv2

go 1.26.7

require (
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.33.0
	google.golang.org/protobuf v1.36.12
)
