package transport

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/bridge"
)

// FinishFunc runs one abandoned call of a method again, through its
// transport's handler and [Handle] with e, the finisher's engine: req is
// the call's kept request, header its kept request metadata with its key
// ([idem.KeyHeader]). Pass ctx as it is down to Handle, which reads the
// finisher's run from it. Its error is the call's, as Handle returned it.
type FinishFunc func(ctx context.Context, e *idem.Engine, req proto.Message, header map[string][]string) error

// RegisterFinish registers run with f as the way to run again the
// abandoned calls of fullMethod ("/pkg.Service/Method"). A method
// registered twice keeps the later run.
func RegisterFinish(f *idem.Finisher, fullMethod string, run FinishFunc) {
	bridge.RegisterFinish(f, fullMethod, func(ctx context.Context, e any, req proto.Message, header map[string][]string) error {
		return run(ctx, e.(*idem.Engine), req, header)
	})
}
