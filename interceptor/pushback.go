package interceptor

import (
	"strconv"

	"google.golang.org/grpc/metadata"
)

// PushbackTrailer is the response trailer in which grpc-go's retry policy
// (a retryPolicy in the service config) reads how many milliseconds to wait
// before its next attempt. [Engine.Handle] adds it to [Answer].Trailer
// whenever idem answers with a RetryInfo of its own (a key in use, a lease
// lost, a store that failed), with the same delay, so that grpc-go's
// retries wait as long as the server asks; the handler's own errors are
// passed on untouched. A transport other than gRPC may translate it (to an
// HTTP Retry-After, say) or drop it.
const PushbackTrailer = "grpc-retry-pushback-ms"

// pushback returns ans with [PushbackTrailer] added when err is an answer of
// idem's that carries a RetryInfo.
func (c *callState) pushback(ans Answer, err error) Answer {
	switch c.result {
	case ResultInUse, ResultLeaseLost, ResultStoreError:
	default:
		return ans
	}
	d, ok := RetryDelay(err)
	if !ok {
		return ans
	}
	ans.Trailer = metadata.Join(ans.Trailer, metadata.Pairs(PushbackTrailer, strconv.FormatInt(d.Milliseconds(), 10)))
	return ans
}
