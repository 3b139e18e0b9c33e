package connectgate

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/gatemetrics"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// metrics are the Prometheus collectors of WithRegisterer; nil without a
// registerer, and every method is a no-op on nil.
type metrics struct {
	calls, events *prometheus.CounterVec
	stages        *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_connectgate_calls_total",
			Help: "Gated Connect calls by procedure and outcome: executed (stored), released (the handler's error, not stored: a retry runs again), replayed, or the reason they were refused.",
		}, []string{"procedure", "outcome"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_connectgate_events_total",
			Help: "Events the caller does not see, by procedure: fenced, finish_retry, outcome_lost, release_retry, release_failure, heartbeat_failure, reconciled, result_too_large, begin_lost, replay_cache_hit, replay_cache_miss.",
		}, []string{"procedure", "event"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemgate_connectgate_stage_seconds",
			Help:    "Where a gated Connect call's time goes, by procedure and stage: prepare (key, tenant, fingerprint), begin (the Dedupe round trip), handler (with the gate's encoding of its answer), finish (storing the outcome before the reply).",
			Buckets: idemgate.StageBuckets,
		}, []string{"procedure", "stage"}),
	}
	// A second Gate on one registry shares the first one's collectors.
	var err error
	if m.calls, err = gatemetrics.Register(reg, m.calls); err != nil {
		return nil, err
	}
	if m.events, err = gatemetrics.Register(reg, m.events); err != nil {
		return nil, err
	}
	if m.stages, err = gatemetrics.Register(reg, m.stages); err != nil {
		return nil, err
	}
	return m, nil
}

// event counts an event the core reports for procedure.
func (m *metrics) event(procedure, event string) {
	if m != nil {
		m.events.WithLabelValues(procedure, event).Inc()
	}
}

// stage observes that a call of procedure spent d in stage.
func (m *metrics) stage(procedure, stage string, d time.Duration) {
	if m != nil {
		m.stages.WithLabelValues(procedure, stage).Observe(d.Seconds())
	}
}

// call counts a gated call: executed or replayed as the core says,
// released when the handler's answer was not stored (VerdictNotRun), or
// the refusal's reason, lower-cased without IDEMPOTENCY_ ("refused" for an
// error without one of the gate's reasons, such as the tenant function's).
func (m *metrics) call(procedure string, result gatecore.Result, verdict gatecore.Verdict, err error) {
	if m == nil {
		return
	}
	outcome := string(result)
	switch {
	case result == gatecore.ResultExecuted && verdict == gatecore.VerdictNotRun:
		outcome = "released"
	case result == gatecore.ResultRefused:
		outcome = "refused"
		if reason := grpcerr.Reason(err); refusals[reason] {
			outcome = strings.ToLower(strings.TrimPrefix(reason, "IDEMPOTENCY_"))
		}
	}
	m.calls.WithLabelValues(procedure, outcome).Inc()
}

// refusals are the gate's reasons, the values of the outcome label besides
// executed, released, replayed and refused.
var refusals = map[string]bool{
	idemgate.ReasonKeyMissing: true, idemgate.ReasonKeyInvalid: true, idemgate.ReasonKeyConflict: true,
	idemgate.ReasonKeyReused: true, idemgate.ReasonInFlight: true, idemgate.ReasonOutcomeUnknown: true,
	idemgate.ReasonResultTooLarge: true, idemgate.ReasonStoreUnavailable: true, idemgate.ReasonStoreRejected: true,
	idemgate.ReasonOutcomeTypeMismatch: true, idemgate.ReasonQuotaExceeded: true,
}
