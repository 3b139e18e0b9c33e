package vocab

import "context"

// Call is what a gated handler's context carries, whatever gate ran it.
type Call struct {
	// Key is the idempotency key as the caller sent it.
	Key string
	// DownstreamKey is the key to hand on to a downstream API.
	DownstreamKey string
	// Scope and Epoch name the reservation (the fencing token).
	Scope string
	Epoch int64
}

type callContextKey struct{}

// WithCall returns ctx carrying c; the engine sets it on a handler's
// context.
func WithCall(ctx context.Context, c *Call) context.Context {
	return context.WithValue(ctx, callContextKey{}, c)
}

// CallFrom returns the gated call ctx belongs to, or false outside one.
func CallFrom(ctx context.Context) (*Call, bool) {
	c, ok := ctx.Value(callContextKey{}).(*Call)
	return c, ok
}
