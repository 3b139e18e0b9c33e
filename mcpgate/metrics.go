package mcpgate

import (
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatemetrics"
)

// metrics are the Prometheus counters of WithRegisterer.
type metrics struct {
	calls, events *prometheus.CounterVec
	// stages observes, per tool, where a gated call's time goes.
	stages *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_mcpgate_calls_total",
			Help: "Gated tools/call requests by tool and outcome: executed, replayed, released (the tool's error result, not stored), or the reason they were refused.",
		}, []string{"tool", "outcome"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_mcpgate_events_total",
			Help: "Events the caller does not see, by tool: the interceptor's events (fenced, finish_retry, outcome_lost, ...).",
		}, []string{"tool", "event"}),
	}
	stages := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idemgate_mcpgate_stage_seconds",
		Help:    "Where a gated tools/call's time goes, by tool and stage: prepare (key, scope, fingerprint), begin (the Dedupe round trip), handler (the tool, with the gate's encoding of its result), finish (storing the outcome before the answer).",
		Buckets: idemgate.StageBuckets,
	}, []string{"tool", "stage"})
	var err error
	if stages, err = gatemetrics.Register(reg, stages); err != nil {
		return nil, err
	}
	m.stages = stages
	for _, vec := range []**prometheus.CounterVec{&m.calls, &m.events} {
		if *vec, err = gatemetrics.Register(reg, *vec); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// event counts an event the core reports for tool; m may be nil.
func (m *metrics) event(tool, event string) {
	if m != nil {
		m.events.WithLabelValues(tool, event).Inc()
	}
}

// stage observes that a call of tool spent d in stage; m may be nil.
func (m *metrics) stage(tool, stage string, d time.Duration) {
	if m != nil {
		m.stages.WithLabelValues(tool, stage).Observe(d.Seconds())
	}
}

// call counts a gated call by what its result says: replayed or executed,
// released for the tool's own error result, or the refusal's reason
// (lower-cased, IDEMPOTENCY_ dropped; "refused" for any other).
func (m *metrics) call(tool string, res mcp.Result, err error) {
	if m == nil {
		return
	}
	outcome := "refused"
	switch r := res.(type) {
	case *storedResult:
		outcome = "executed"
		if r.replayed {
			outcome = "replayed"
		}
	case *mcp.CallToolResult:
		e, _ := r.Meta[MetaError].(map[string]any)
		reason, _ := e["reason"].(string)
		switch {
		case e == nil:
			outcome = "released"
		case knownReasons[reason]:
			outcome = strings.ToLower(strings.TrimPrefix(reason, "IDEMPOTENCY_"))
		}
	}
	if err != nil && res == nil {
		outcome = "released"
	}
	m.calls.WithLabelValues(tool, outcome).Inc()
}

var knownReasons = map[string]bool{
	idemgate.ReasonKeyMissing: true, idemgate.ReasonKeyInvalid: true, idemgate.ReasonKeyConflict: true, idemgate.ReasonKeyReused: true,
	idemgate.ReasonInFlight: true, idemgate.ReasonOutcomeUnknown: true, idemgate.ReasonResultTooLarge: true, idemgate.ReasonStoreUnavailable: true,
	idemgate.ReasonStoreRejected: true, idemgate.ReasonOutcomeTypeMismatch: true, idemgate.ReasonQuotaExceeded: true,
}
