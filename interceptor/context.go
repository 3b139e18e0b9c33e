package interceptor

import "context"

type keyContextKey struct{}

// KeyFromContext returns the idempotency key of the gated call that ctx
// belongs to, so a handler can hand it on to a downstream API that takes
// idempotency keys (payment providers do). It reports false outside a gated
// call.
func KeyFromContext(ctx context.Context) (string, bool) {
	key, ok := ctx.Value(keyContextKey{}).(string)
	return key, ok
}

func contextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}
