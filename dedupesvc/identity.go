package dedupesvc

import "context"

// Caller is who called the Dedupe service, as an authenticator established
// it (see dedupesvc/auth).
type Caller struct {
	// Name identifies the calling service: a SPIFFE ID, a certificate
	// subject, or a bearer token's configured name. Records are namespaced
	// by it, so one service never sees another's.
	Name string
	// Admin allows the admin RPCs.
	Admin bool
}

type callerKey struct{}

// ContextWithCaller returns ctx carrying the authenticated caller.
func ContextWithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFromContext returns the authenticated caller, if any.
func CallerFromContext(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// namespaceSeparator joins the caller's name and the scope. It is a control
// character, which no caller name may contain, so the two never run together
// ambiguously.
const namespaceSeparator = "\x1f"

// namespaced returns the scope as stored: prefixed by the authenticated
// caller's name, so callers cannot reach each other's records. Without an
// authenticated caller (no authenticator installed) the scope is stored as is.
func namespaced(ctx context.Context, scope string) string {
	c, _ := CallerFromContext(ctx)
	return JoinScope(c.Name, scope)
}
