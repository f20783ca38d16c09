package record_test

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemkit/idem/internal/record"
)

func Example() {
	// A handler failed with NotFound and set a trailer: record its status.
	st := &spb.Status{Code: int32(code.Code_NOT_FOUND), Message: "no such payment"}
	body, payload, err := record.Encode(code.Code_NOT_FOUND, st, nil, map[string][]string{
		"x-lookup":    {"payments"},
		"grpc-status": {"5"}, // the transport's, not recorded
	})
	if err != nil {
		panic(err)
	}
	_ = payload // what the first reply sends

	// A retry: read the body back.
	r, err := record.Decode(body)
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Code, r.Trailer, string(r.Payload) == string(payload))
	// Output: NOT_FOUND map[x-lookup:[payments]] true
}
