package idem

import (
	"context"

	"github.com/idemkit/idem/internal/bridge"
)

// The engine's entry points for package transport, through package
// bridge: transport imports idem, so idem hands them over rather than
// importing it.
func init() {
	bridge.Handle = func(ctx context.Context, e any, call bridge.Call, h bridge.Handler) (bridge.Answer, error) {
		a, err := e.(*Engine).handle(ctx, call, h)
		return bridge.Answer{Message: a.Message, Header: a.Header, Trailer: a.Trailer, Result: string(a.Result), Wire: a.wire}, err
	}
	bridge.RegisterFinish = func(f any, fullMethod string, run bridge.FinishFunc) {
		f.(*Finisher).register(fullMethod, run)
	}
	bridge.NewOutgoingKeys = func(opts any) bridge.KeysFunc {
		o, _ := opts.([]ClientOption)
		return newOutgoingKeys(o...).keysFor
	}
	bridge.ValidateKey = validateKey
	bridge.InvalidKey = invalidKey
}
