package gatecore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// CallInfo is what a gated handler's context (Attempt.Context) carries,
// whatever gate ran it, so idemgate.KeyFromContext, httpgate's and
// mcpgate's read it alike.
type CallInfo struct {
	// Key is the idempotency key as the caller sent it.
	Key string
	// DownstreamKey is the key to hand on to a downstream API.
	DownstreamKey string
	// Scope and Epoch name the reservation (the fencing token).
	Scope string
	Epoch int64
}

type callContextKey struct{}

// withCall returns ctx carrying c's identity under the reservation of epoch.
func withCall(ctx context.Context, c *Call, epoch int64) context.Context {
	return context.WithValue(ctx, callContextKey{}, &CallInfo{Key: c.Key, DownstreamKey: downstreamKey(c.Scope, c.Key), Scope: c.Scope, Epoch: epoch})
}

// CallFrom returns the gated call ctx belongs to, or false outside one.
func CallFrom(ctx context.Context) (*CallInfo, bool) {
	c, ok := ctx.Value(callContextKey{}).(*CallInfo)
	return c, ok
}

// downstreamKey is "idg_" and 32 hex digits of a SHA-256 of the scope and
// the caller's key.
func downstreamKey(scope, key string) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return "idg_" + hex.EncodeToString(h.Sum(nil)[:16])
}
