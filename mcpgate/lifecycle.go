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

// What a tool's error means for the record, whatever the tool policy says,
// a tool says with package idemgate's marks: idemgate.FinalError (stored and
// replayed even without ReplayErrors), idemgate.RetryableError (the key is
// released) and idemgate.OutcomeUnknownError. A typed tool (mcp.AddTool)
// returns the marked error as its error; the SDK makes it the error result
// and the gate reads the mark. Errors that wrap context.DeadlineExceeded or
// context.Canceled, or carry the gRPC code DEADLINE_EXCEEDED or CANCELLED,
// are outcome-unknown unmarked.

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

// DefaultDedupeFailureLogInterval is how often at most a Dedupe RPC failure
// is logged while the failure stays the same
// (WithDedupeFailureLogInterval): 10s.
const DefaultDedupeFailureLogInterval = gatecore.DefaultDedupeFailureLogInterval

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

// WatchDedupe keeps hs's status for idemgate.DedupeHealthService in step with the
// Dedupe service until ctx ends: NOT_SERVING while the connection
// (WithDedupeConn) is not ready or the last answer to a gated call or a
// check was a failure, SERVING otherwise, starting NOT_SERVING until it
// knows; a failing service is re-checked every 5s, and each change is
// logged, as the gRPC interceptor's WatchDedupe does. Run it in its own
// goroutine.
func (g *Gate) WatchDedupe(ctx context.Context, hs idemgate.HealthSetter) { g.dedupe.Watch(ctx, hs) }

// What a gated tool's context carries (its key, the key to hand downstream,
// its fencing token) a tool reads with package idemgate's KeyFromContext,
// DownstreamKeyFromContext and FencingTokenFromContext, as under every gate.
