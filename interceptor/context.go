package interceptor

import (
	"context"

	"github.com/idemgate/idemgate"
)

// Causes a gated handler's context can end with (context.Cause).
var (
	// ErrFenced: the attempt lost its reservation.
	//
	// Deprecated: use idemgate.ErrFenced, its home shared by every gate.
	ErrFenced = idemgate.ErrFenced
	// ErrExecutionTimeout: the method's execution_timeout ran out.
	//
	// Deprecated: use idemgate.ErrExecutionTimeout, its home shared by
	// every gate.
	ErrExecutionTimeout = idemgate.ErrExecutionTimeout
)

// FencingToken names one reservation of one key.
//
// Deprecated: use idemgate.FencingToken, its home shared by every gate.
type FencingToken = idemgate.FencingToken

// KeyFromContext returns the idempotency key of the gated call that ctx
// belongs to.
//
// Deprecated: use idemgate.KeyFromContext, its home shared by every gate.
func KeyFromContext(ctx context.Context) (string, bool) { return idemgate.KeyFromContext(ctx) }

// DownstreamKeyFromContext returns the idempotency key to hand on to a
// downstream API that dedupes on one.
//
// Deprecated: use idemgate.DownstreamKeyFromContext, its home shared by
// every gate.
func DownstreamKeyFromContext(ctx context.Context) (string, bool) {
	return idemgate.DownstreamKeyFromContext(ctx)
}

// FencingTokenFromContext returns the reservation a gated handler runs
// under.
//
// Deprecated: use idemgate.FencingTokenFromContext, its home shared by
// every gate.
func FencingTokenFromContext(ctx context.Context) (FencingToken, bool) {
	return idemgate.FencingTokenFromContext(ctx)
}
