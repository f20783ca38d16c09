package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idemkit/idem/store"
)

func TestStoreError(t *testing.T) {
	for _, c := range []struct {
		err       error
		code      code.Code
		retryInfo bool
	}{
		{fmt.Errorf("x: %w", store.ErrInUse), code.Code_ABORTED, true},
		{fmt.Errorf("x: %w", store.ErrConflict), code.Code_ABORTED, true},
		{context.Canceled, code.Code_CANCELLED, false},
		{context.DeadlineExceeded, code.Code_DEADLINE_EXCEEDED, false},
		{fmt.Errorf("%w: tenant is not valid UTF-8", store.ErrInvalidScope), code.Code_INVALID_ARGUMENT, false},
		{errors.New("connection refused"), code.Code_UNAVAILABLE, true},
	} {
		e := &Engine{opts: evaluateOptions([]Option{WithRetryDelay(time.Second), WithLogger(slog.New(slog.DiscardHandler))})}
		_, err := e.storeError(context.Background(), &callState{}, "claiming", c.err)
		ie := err.(*Error)
		_, hasRetry := ie.RetryDelay()
		if got := code.Code(ie.Status().GetCode()); got != c.code || hasRetry != c.retryInfo {
			t.Errorf("%v: %v (RetryInfo %v), want %v (RetryInfo %v)", c.err, got, hasRetry, c.code, c.retryInfo)
		}
	}
}
