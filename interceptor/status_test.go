package interceptor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/store"
)

func TestStoreError(t *testing.T) {
	for _, c := range []struct {
		err       error
		code      codes.Code
		retryInfo bool
	}{
		{fmt.Errorf("x: %w", store.ErrInUse), codes.Aborted, true},
		{fmt.Errorf("x: %w", store.ErrConflict), codes.Aborted, true},
		{context.Canceled, codes.Canceled, false},
		{context.DeadlineExceeded, codes.DeadlineExceeded, false},
		{fmt.Errorf("%w: tenant is not valid UTF-8", store.ErrInvalidKey), codes.InvalidArgument, false},
		{errors.New("connection refused"), codes.Unavailable, true},
	} {
		e := &Engine{opts: evaluateServerOptions([]ServerOption{WithRetryDelay(time.Second), WithLogger(slog.New(slog.DiscardHandler))})}
		st := status.Convert(e.storeError(context.Background(), &callState{}, "claiming", c.err))
		var hasRetry bool
		for _, d := range st.Details() {
			_, ok := d.(*errdetails.RetryInfo)
			hasRetry = hasRetry || ok
		}
		if st.Code() != c.code || hasRetry != c.retryInfo {
			t.Errorf("%v: %v (RetryInfo %v), want %v (RetryInfo %v)", c.err, st.Code(), hasRetry, c.code, c.retryInfo)
		}
	}
}
