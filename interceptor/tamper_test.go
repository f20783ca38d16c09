package interceptor_test

import (
	"context"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fingerprint"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest/grpctest"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestTamperedRecordIsNotReplayed changes recorded rows as someone with
// write access to the table could: every change is refused with INTERNAL
// and logged, and none is replayed. Do's responses are replayed as their
// raw bytes, Maybe's decoded: both are covered.
func TestTamperedRecordIsNotReplayed(t *testing.T) {
	for _, c := range []struct {
		name string
		// recordError records INVALID_ARGUMENT instead of a response.
		recordError bool
		tamper      string
	}{
		{"recorded error relabelled OK", true, `UPDATE idempotency_keys SET response_code = 0`},
		{"recorded error relabelled with another error code", true, `UPDATE idempotency_keys SET response_code = 5`},
		{"recorded error with code 99", true, `UPDATE idempotency_keys SET response_code = 99`},
		{"response with code 99", false, `UPDATE idempotency_keys SET response_code = 99`},
		{"response relabelled as an error", false, `UPDATE idempotency_keys SET response_code = 3`},
		{"response with a flipped byte", false,
			`UPDATE idempotency_keys SET response = set_byte(response, length(response) - 1, get_byte(response, length(response) - 1) # 1)`},
		{"recorded error with a flipped byte", true,
			`UPDATE idempotency_keys SET response = set_byte(response, length(response) - 1, get_byte(response, length(response) - 1) # 1)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, setup{})
			if c.recordError {
				e.svc.setHook(func(context.Context, string) error {
					return status.Error(codes.InvalidArgument, "value rejected")
				})
			}
			calls := map[string]func(opts ...grpc.CallOption) (proto.Message, error){
				"Do": func(opts ...grpc.CallOption) (proto.Message, error) {
					return e.client.Do(withKey("do"), &testv1.DoRequest{Value: "v"}, opts...)
				},
				"Maybe": func(opts ...grpc.CallOption) (proto.Message, error) {
					return e.client.Maybe(withKey("maybe"), &testv1.MaybeRequest{Value: "v"}, opts...)
				},
			}
			for _, call := range calls {
				if _, err := call(); (err != nil) != c.recordError {
					t.Fatalf("first call: %v", err)
				}
			}
			if _, err := e.pool.Exec(context.Background(), c.tamper); err != nil {
				t.Fatal(err)
			}
			for name, call := range calls {
				var header metadata.MD
				resp, err := call(grpc.Header(&header))
				wantCode(t, err, codes.Internal)
				if len(header.Get(idem.ReplayedHeader)) != 0 {
					t.Fatalf("%s: a tampered record was replayed: %v", name, resp)
				}
			}
			if n := e.svc.count(); n != 2 {
				t.Fatalf("handler ran %d times, want 2: once per method", n)
			}
			if n := e.keys(t); n != 2 {
				t.Fatalf("%d keys, want the 2 tampered ones, as they were", n)
			}
			wantLogged(t, e.log, "level=ERROR", "cannot be replayed", "method="+testv1.TestService_Do_FullMethodName)
			wantLogged(t, e.log, "level=ERROR", "cannot be replayed", "method="+testv1.TestService_Maybe_FullMethodName)
		})
	}
}

// TestRecordsOfEarlierVersions replays rows written before recorded
// outcomes carried a checksum: sound ones replay byte for byte; an error's
// google.rpc.Status relabelled as a response is refused where the response
// type is decoded (its fields are unknown to the response type).
func TestRecordsOfEarlierVersions(t *testing.T) {
	e := newEnv(t, setup{})
	insert := func(method, key string, req proto.Message, code codes.Code, body []byte) {
		t.Helper()
		fp, err := fingerprint.Sum(req)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.pool.Exec(context.Background(),
			`INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, response, expires_at)
			 VALUES (`+pgtest.KeyIDSQL("''", "$1::text", "$2::text")+`, '', $1, $2, $3, 'recorded', $4, $5, now() + interval '1 hour')`,
			method, key, fp, int32(code), body)
		if err != nil {
			t.Fatal(err)
		}
	}
	maybeReq := &testv1.MaybeRequest{Value: "v"}
	doReq := &testv1.DoRequest{Value: "v"}
	recorded := &testv1.MaybeResponse{Value: "v", Execution: 7}
	maybeBody, err := proto.MarshalOptions{Deterministic: true}.Marshal(recorded)
	if err != nil {
		t.Fatal(err)
	}
	doBody, err := proto.MarshalOptions{Deterministic: true}.Marshal(&testv1.DoResponse{Value: "v", Execution: 7, Labels: map[string]string{"a": "1", "b": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	statusBody, err := proto.Marshal(status.New(codes.InvalidArgument, "value rejected").Proto())
	if err != nil {
		t.Fatal(err)
	}
	insert(maybeMethod, "ok", maybeReq, codes.OK, maybeBody)
	insert(testv1.TestService_Do_FullMethodName, "ok", doReq, codes.OK, doBody)
	insert(maybeMethod, "error", maybeReq, codes.InvalidArgument, statusBody)
	insert(maybeMethod, "relabelled", maybeReq, codes.OK, statusBody)
	insert(maybeMethod, "code-99", maybeReq, 99, statusBody)
	status99, err := proto.Marshal(&spb.Status{Code: 99, Message: "no such code"})
	if err != nil {
		t.Fatal(err)
	}
	insert(maybeMethod, "status-99", maybeReq, 99, status99)

	codec := grpctest.NewRawCodec()
	var header metadata.MD
	got, err := e.client.Maybe(withKey("ok"), maybeReq, grpc.ForceCodecV2(codec), grpc.Header(&header))
	if err != nil || !proto.Equal(got, recorded) || string(codec.Last()) != string(maybeBody) || len(header.Get(idem.ReplayedHeader)) != 1 {
		t.Fatalf("replay of an earlier Maybe record: %v, %v (bytes %x), want %v (bytes %x)", got, err, codec.Last(), recorded, maybeBody)
	}
	if _, err := e.client.Do(withKey("ok"), doReq, grpc.ForceCodecV2(codec)); err != nil || string(codec.Last()) != string(doBody) {
		t.Fatalf("replay of an earlier Do record: %v, bytes %x, want %x", err, codec.Last(), doBody)
	}
	_, err = e.client.Maybe(withKey("error"), maybeReq, grpc.Header(&header))
	if st := wantCode(t, err, codes.InvalidArgument); st.Message() != "value rejected" || len(header.Get(idem.ReplayedHeader)) != 1 {
		t.Fatalf("replay of an earlier error: %v", st.Proto())
	}
	for _, key := range []string{"relabelled", "code-99", "status-99"} {
		_, err = e.client.Maybe(withKey(key), maybeReq)
		wantCode(t, err, codes.Internal)
	}
	if n := e.svc.count(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
}
