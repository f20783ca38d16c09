package retryhint

import (
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestRetryable(t *testing.T) {
	for c := range code.Code_name {
		for _, replayed := range []bool{false, true} {
			want := !replayed && (code.Code(c) == code.Code_ABORTED || code.Code(c) == code.Code_UNAVAILABLE)
			if got := Retryable(code.Code(c), replayed); got != want {
				t.Errorf("Retryable(%v, replayed %v) = %v, want %v", code.Code(c), replayed, got, want)
			}
		}
	}
}

func TestDelay(t *testing.T) {
	status := func(details ...proto.Message) *spb.Status {
		st := &spb.Status{Code: int32(code.Code_ABORTED)}
		for _, d := range details {
			a, err := anypb.New(d)
			if err != nil {
				t.Fatal(err)
			}
			st.Details = append(st.Details, a)
		}
		return st
	}
	cases := []struct {
		name string
		st   *spb.Status
		d    time.Duration
		ok   bool
	}{
		{"nil", nil, 0, false},
		{"no details", status(), 0, false},
		{"other details", status(&errdetails.ErrorInfo{Reason: "R"}), 0, false},
		{"RetryInfo without a delay", status(&errdetails.RetryInfo{}), 0, false},
		{"RetryInfo after another detail", status(&errdetails.ErrorInfo{Reason: "R"},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)}), 1500 * time.Millisecond, true},
		{"zero", status(&errdetails.RetryInfo{RetryDelay: durationpb.New(0)}), 0, true},
		{"negative", status(&errdetails.RetryInfo{RetryDelay: durationpb.New(-time.Second)}), 0, true},
	}
	for _, c := range cases {
		if d, ok := Delay(c.st); d != c.d || ok != c.ok {
			t.Errorf("%s: Delay = %v, %v; want %v, %v", c.name, d, ok, c.d, c.ok)
		}
	}
}
