package idemgate

import (
	"context"
	"errors"

	"github.com/idemgate/idemgate/internal/vocab"
)

// Causes a gated handler's context can end with (context.Cause). The handler
// runs on a context that keeps the caller's values but not its cancellation
// or deadline, so only these two end it early.
var (
	// ErrFenced: the attempt lost its reservation (its lease ran out and
	// another attempt took the key over, or an operator settled the record),
	// so whatever it does next is refused by the Dedupe service. Stop, and do
	// not write downstream without the FencingToken.
	ErrFenced = errors.New("idemgate: this attempt was fenced: its reservation was taken over or settled by another attempt, and its outcome will be refused")
	// ErrExecutionTimeout: the method's execution_timeout ran out.
	ErrExecutionTimeout = errors.New("idemgate: the handler ran past its execution_timeout")
)

// FencingToken names one reservation of one key. Epoch grows every time the
// key is reserved anew (a REEXECUTE takeover, a retry after a release), so a
// downstream system that supports conditional writes can refuse a write
// whose epoch is lower than one it has already seen for the same scope and
// key: a fenced attempt that is still running then cannot overwrite the work
// of the attempt that took over.
type FencingToken struct {
	// Scope is the record's scope as the gate sends it: the method's or
	// route's action, then "|" and the tenant when there is one.
	Scope string
	// Key is the idempotency key.
	Key string
	// Epoch of this attempt's reservation, from 1.
	Epoch int64
}

// KeyFromContext returns the idempotency key of the gated call that ctx
// belongs to, exactly as the caller sent it. It reports false outside a
// gated call. The same key may name different actions of different tenants
// or methods, so do not send it to a downstream system that dedupes on it:
// send DownstreamKeyFromContext instead.
func KeyFromContext(ctx context.Context) (string, bool) {
	c, ok := vocab.CallFrom(ctx)
	if !ok {
		return "", false
	}
	return c.Key, true
}

// DownstreamKeyFromContext returns the idempotency key to hand on to a
// downstream API that dedupes on one (a payment provider's Idempotency-Key):
// "idg_" and 32 hex digits of a SHA-256 of the scope (action and tenant) and
// the caller's key. It is the same for every attempt at one action, also
// after a REEXECUTE takeover, so the provider collapses a re-run into the
// first charge; and it differs between tenants and actions that happen to
// use the same key, so they never collide at the provider. It reports false
// outside a gated call.
func DownstreamKeyFromContext(ctx context.Context) (string, bool) {
	c, ok := vocab.CallFrom(ctx)
	if !ok {
		return "", false
	}
	return c.DownstreamKey, true
}

// FencingTokenFromContext returns the reservation a gated handler runs
// under, for a downstream system that supports conditional writes. It
// reports false outside a gated call.
func FencingTokenFromContext(ctx context.Context) (FencingToken, bool) {
	c, ok := vocab.CallFrom(ctx)
	if !ok {
		return FencingToken{}, false
	}
	return FencingToken{Scope: c.Scope, Key: c.Key, Epoch: c.Epoch}, true
}
