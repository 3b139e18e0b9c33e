package mcpgate

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/idemgate/idemgate"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate/internal/gatecore"
)

// What a tool's error means for the record, whatever the tool policy says.
// A tool returns the marked error (a typed tool, from mcp.AddTool, as its
// error; the SDK makes it the error result and the gate reads the mark).

// FinalError marks a tool's error as the action's final outcome: the error
// result is stored and replayed to every duplicate, even without
// ReplayErrors. Return it when the side effect was decided (a card declined
// by the provider) and running again must not happen.
func FinalError(err error) error { return idemgate.FinalError(err) }

// RetryableError marks a tool's error as not an outcome, even with
// ReplayErrors: the key is released and a retry runs again. Return it only
// when the side effect certainly did not happen.
func RetryableError(err error) error { return idemgate.RetryableError(err) }

// OutcomeUnknownError marks a tool's error as leaving its side effect's
// outcome unknown (the provider's client timed out after sending the
// request): under FAIL_CLOSED the record becomes outcome-unknown and the
// caller, and every duplicate, is refused IDEMPOTENCY_OUTCOME_UNKNOWN until
// it is resolved or Reconcile settles it; under REEXECUTE the key is freed.
// Errors that wrap context.DeadlineExceeded or context.Canceled, or carry
// the gRPC code DEADLINE_EXCEEDED or CANCELLED, are treated so unmarked.
func OutcomeUnknownError(err error) error { return idemgate.OutcomeUnknownError(err) }

// Reconciler is asked what happened to an earlier attempt whose outcome was
// lost: key is the call's idempotency key and arguments its arguments. An
// error leaves the outcome unknown.
type Reconciler func(ctx context.Context, key string, arguments json.RawMessage) (Resolution, error)

// Resolution is a Reconciler's answer.
type Resolution struct {
	result *mcp.CallToolResult
	notRun bool
}

// ResolvedResult says the side effect happened and result is what the tool
// returned: it is stored and replayed like a result.
func ResolvedResult(result *mcp.CallToolResult) Resolution { return Resolution{result: result} }

// ResolvedNotRun says the side effect did not happen: the record is
// released and the call runs the tool.
func ResolvedNotRun() Resolution { return Resolution{notRun: true} }

// StillUnknown says the reconciler cannot tell; the caller gets
// IDEMPOTENCY_OUTCOME_UNKNOWN.
func StillUnknown() Resolution { return Resolution{} }

// core is the resolution as the core settles it: a result as the gate
// stores one.
func (r Resolution) core() (gatecore.Resolution, error) {
	switch {
	case r.notRun:
		return gatecore.ResolvedNotRun(), nil
	case r.result == nil:
		return gatecore.StillUnknown(), nil
	}
	raw, err := json.Marshal(r.result)
	if err != nil {
		return gatecore.StillUnknown(), gatecore.BadResolution(fmt.Errorf("encode the reconciler's result: %w", err))
	}
	outcome, err := gatecore.MarshalAny(wrapperspb.Bytes(raw))
	if err != nil {
		return gatecore.StillUnknown(), gatecore.BadResolution(fmt.Errorf("serialize the reconciler's result: %w", err))
	}
	return gatecore.ResolvedOutcome(outcome), nil
}

// DedupeHealthService is the service name under which WatchDedupe reports
// the Dedupe service's health: SERVING while gated calls can reach it,
// NOT_SERVING while they cannot (the gRPC interceptor's name).
const DedupeHealthService = idemgate.DedupeHealthService

// DefaultDedupeFailureLogInterval is how often at most a Dedupe RPC failure
// is logged while the failure stays the same
// (WithDedupeFailureLogInterval): 10s.
const DefaultDedupeFailureLogInterval = gatecore.DefaultDedupeFailureLogInterval

// HealthSetter is the part of a health service WatchDedupe uses;
// *health.Server (google.golang.org/grpc/health) implements it, and so can
// an HTTP readiness endpoint's state.
type HealthSetter = idemgate.HealthSetter

// CheckDedupe asks the Dedupe service whether it serves this server, for a
// start-up check: one Heartbeat of a record that never exists, which
// crosses the network, the service's authentication and its store, and
// changes nothing. It returns nil when the service works, else UNAVAILABLE
// (IDEMPOTENCY_STORE_UNAVAILABLE) when it or its store cannot be reached, or
// INTERNAL (IDEMPOTENCY_STORE_REJECTED) when it refuses this server; either
// with ErrorInfo metadata "dedupe_code" and, with WithDedupeConn, "dedupe"
// (its address). ctx bounds it; without a deadline, the Dedupe timeout
// does.
func (g *Gate) CheckDedupe(ctx context.Context) error {
	timeout := g.opts.dedupeTimeout
	if timeout <= 0 {
		timeout = gatecore.DefaultDedupeTimeout
	}
	return g.dedupe.Check(ctx, timeout)
}

// WatchDedupe keeps hs's status for DedupeHealthService in step with the
// Dedupe service until ctx ends: NOT_SERVING while the connection
// (WithDedupeConn) is not ready or the last answer to a gated call or a
// check was a failure, SERVING otherwise, starting NOT_SERVING until it
// knows; a failing service is re-checked every 5s, and each change is
// logged, as the gRPC interceptor's WatchDedupe does. Run it in its own
// goroutine.
func (g *Gate) WatchDedupe(ctx context.Context, hs HealthSetter) { g.dedupe.Watch(ctx, hs) }

// What a gated handler's context carries, as under every gate: see the
// interceptor's functions of the same names. A handler gets its request's
// context (for httpgate r.Context(), for mcpgate the tool's ctx).

// FencingToken names one reservation of one key (idemgate.FencingToken).
type FencingToken = idemgate.FencingToken

// KeyFromContext returns the idempotency key of the gated call ctx belongs
// to, as the caller sent it (or derived it from the fingerprint); false
// outside a gated call. Hand DownstreamKeyFromContext's to a downstream
// API instead.
func KeyFromContext(ctx context.Context) (string, bool) { return idemgate.KeyFromContext(ctx) }

// DownstreamKeyFromContext returns the key to hand on to a downstream API
// that dedupes on one: the same for every attempt at one action, different
// for other scopes and tenants; false outside a gated call.
func DownstreamKeyFromContext(ctx context.Context) (string, bool) {
	return idemgate.DownstreamKeyFromContext(ctx)
}

// FencingTokenFromContext returns the reservation a gated handler runs
// under, for a downstream system that supports conditional writes; false
// outside a gated call.
func FencingTokenFromContext(ctx context.Context) (FencingToken, bool) {
	return idemgate.FencingTokenFromContext(ctx)
}
