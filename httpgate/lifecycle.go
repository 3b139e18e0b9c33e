package httpgate

import (
	"context"
	"fmt"
	"github.com/idemgate/idemgate"
	"net/http"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/replayfields"
)

// Close waits until every outcome and release still being retried in the
// background, and every FinishAfterReply outcome not yet stored, is settled
// or given up; when ctx ends first it stops them (each is logged and
// counted as given up) and returns ctx's error. Call it after the HTTP
// server shut down.
func (g *Gate) Close(ctx context.Context) error { return g.engine.Close(ctx) }

// Stats is what the gate did that no caller saw (the interceptor's Stats).
type Stats = gatecore.Stats

// Stats returns the counters since New.
func (g *Gate) Stats() Stats { return g.engine.Stats() }

// DefaultDedupeFailureLogInterval is how often at most a Dedupe RPC failure
// is logged while it stays the same (WithDedupeFailureLogInterval): 10s.
const DefaultDedupeFailureLogInterval = gatecore.DefaultDedupeFailureLogInterval

// CheckDedupe asks the Dedupe service whether it serves this API, for a
// start-up or readiness check: one Heartbeat of a record that never exists,
// which crosses the network, the service's authentication and its store,
// and changes nothing. It returns nil when the service works, else a gRPC
// status error with reason IDEMPOTENCY_STORE_UNAVAILABLE or
// IDEMPOTENCY_STORE_REJECTED. ctx bounds it; without a deadline, the Dedupe
// timeout does.
func (g *Gate) CheckDedupe(ctx context.Context) error {
	timeout := g.opts.dedupeTimeout
	if timeout <= 0 {
		timeout = gatecore.DefaultDedupeTimeout
	}
	return g.dedupe.Check(ctx, timeout)
}

// WatchDedupe keeps hs's status for idemgate.DedupeHealthService in step with the
// Dedupe service until ctx ends: NOT_SERVING while the connection
// (WithDedupeConn) is not ready or the last answer was a failure, SERVING
// otherwise; a failing service is re-checked every 5s, and each change is
// logged. Run it in its own goroutine.
func (g *Gate) WatchDedupe(ctx context.Context, hs idemgate.HealthSetter) { g.dedupe.Watch(ctx, hs) }

// Resolution is a Reconciler's answer about a lost outcome.
type Resolution struct {
	kind int
	resp *idemgatev1.HttpResponse
}

const (
	stillUnknown = iota
	resolvedResponse
	resolvedNotRun
)

// ResolvedResponse says the action ended with this response: it is stored
// and replayed to the request and its duplicates, as if the handler had
// written it (the headers filtered as a handler's are).
func ResolvedResponse(status int, header http.Header, body []byte) Resolution {
	return Resolution{kind: resolvedResponse, resp: &idemgatev1.HttpResponse{Status: int32(status), Headers: storedHeaders(header, replayfields.Rule{}), Body: body}}
}

// ResolvedNotRun says the side effect did not happen: the record is
// released and the request runs the handler.
func ResolvedNotRun() Resolution { return Resolution{kind: resolvedNotRun} }

// StillUnknown says the reconciler cannot tell: the request gets 409
// IDEMPOTENCY_OUTCOME_UNKNOWN.
func StillUnknown() Resolution { return Resolution{} }

// reconcile asks the route's Reconciler, as the core settles it.
func (c *call) reconcile(ctx context.Context, key string) (gatecore.Resolution, error) {
	res, err := c.route.policy.Reconciler(ctx, key, c.r, c.body)
	if err != nil {
		return gatecore.StillUnknown(), err
	}
	switch res.kind {
	case resolvedResponse:
		if res.resp.GetStatus() < 200 || res.resp.GetStatus() > 999 {
			return gatecore.StillUnknown(), gatecore.BadResolution(fmt.Errorf("the reconciler answered the status %d", res.resp.GetStatus()))
		}
		// The gate's own per-caller fields (WithPerCallerHeaders) are not
		// stored either; a copy, as the reconciler may answer one value twice.
		resp := &idemgatev1.HttpResponse{Status: res.resp.GetStatus(), Body: res.resp.GetBody()}
		for _, hh := range res.resp.GetHeaders() {
			if stored(hh.GetName(), c.g.opts.perCaller) {
				resp.Headers = append(resp.Headers, hh)
			}
		}
		outcome, err := gatecore.MarshalAny(resp)
		if err != nil {
			return gatecore.StillUnknown(), gatecore.BadResolution(fmt.Errorf("serialize the reconciler's response: %w", err))
		}
		return gatecore.ResolvedOutcome(outcome), nil
	case resolvedNotRun:
		return gatecore.ResolvedNotRun(), nil
	}
	return gatecore.StillUnknown(), nil
}
