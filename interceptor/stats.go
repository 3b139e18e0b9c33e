package interceptor

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatemetrics"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// Stats counts what the interceptor did that a caller cannot see, so nothing
// is dropped silently. Read it with Gate.Stats; with WithRegisterer the same
// events are Prometheus counters too.
type Stats struct {
	// Fenced counts heartbeats and Finishes refused because the attempt had
	// lost its reservation (its lease ran out and the record was taken over
	// or marked outcome-unknown). The refused outcome never overwrote a
	// newer one.
	Fenced int64
	// FinishRetries counts Finish attempts repeated after the Dedupe service
	// could not take an outcome.
	FinishRetries int64
	// OutcomesLost counts side effects whose outcome was never stored: the
	// Finish retries ran out, or the handler panicked. Their records go down
	// the on_lost_outcome path.
	OutcomesLost int64
	// ReleaseRetries counts Release attempts repeated after the Dedupe
	// service could not take one.
	ReleaseRetries int64
	// ReleaseFailures counts handler errors whose reservation could not be
	// released within the retry budget, or whose release was rejected; the
	// key stays in flight until its lease runs out.
	ReleaseFailures int64
	// HeartbeatFailures counts heartbeats that did not reach the Dedupe
	// service (a fenced one counts in Fenced instead).
	HeartbeatFailures int64
	// Reconciled counts lost outcomes a Reconciler settled.
	Reconciled int64
	// TooLarge counts outcomes over the size limit (the Gate's, or the
	// Dedupe service's when it is lower), stored as a marker.
	TooLarge int64
	// LostBegins counts Begins whose answer never arrived. Each is re-sent
	// in the background and a reservation it made is released, so a handler
	// that never ran does not leave its key blocked.
	LostBegins int64
	// ReplayCacheHits counts duplicates answered from the replay cache
	// (WithReplayCache) without a Dedupe call.
	ReplayCacheHits int64
	// ReplayCacheMisses counts gated calls the replay cache could not answer
	// (no entry, an expired one, or another fingerprint).
	ReplayCacheMisses int64
}

// Stats returns the counters since the Gate was built.
func (g *Gate) Stats() Stats {
	s := g.engine.Stats()
	return Stats{
		Fenced:            s.Fenced,
		FinishRetries:     s.FinishRetries,
		OutcomesLost:      s.OutcomesLost,
		ReleaseRetries:    s.ReleaseRetries,
		ReleaseFailures:   s.ReleaseFailures,
		HeartbeatFailures: s.HeartbeatFailures,
		Reconciled:        s.Reconciled,
		TooLarge:          s.TooLarge,
		LostBegins:        s.LostBegins,
		ReplayCacheHits:   s.ReplayCacheHits,
		ReplayCacheMisses: s.ReplayCacheMisses,
	}
}

// metrics are the Prometheus metrics of WithRegisterer.
type metrics struct {
	calls  *prometheus.CounterVec
	events *prometheus.CounterVec
	// replayAge observes, per method, how long ago each replayed outcome
	// was stored: every run the gate suppressed shows here.
	replayAge *prometheus.HistogramVec
	// stages observes, per method, where a gated call's time goes.
	stages *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_interceptor_calls_total",
			Help: "Gated calls by method and outcome: executed, replayed, or the reason they were refused.",
		}, []string{"method", "outcome"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_interceptor_events_total",
			Help: "Events the caller does not see, by method: fenced, finish_retry, outcome_lost, release_retry, release_failure, heartbeat_failure, reconciled, result_too_large, begin_lost, replay_cache_hit, replay_cache_miss.",
		}, []string{"method", "event"}),
	}
	m.replayAge = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idemgate_interceptor_replay_age_seconds",
		Help:    "Age of each outcome answered from storage instead of running the handler (a replay from the Dedupe service or the replay cache): seconds since it was stored, by method.",
		Buckets: idemgate.ReplayAgeBuckets,
	}, []string{"method"})
	m.stages = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idemgate_interceptor_stage_seconds",
		Help:    "Where a gated call's time goes on the tool server, by method and stage: prepare (key, scope, fingerprint), begin (the Dedupe round trip), handler (with the gate's encoding of its answer), finish (storing the outcome before the reply).",
		Buckets: idemgate.StageBuckets,
	}, []string{"method", "stage"})
	// A second Gate on one registry shares the first one's metrics.
	var err error
	if m.stages, err = gatemetrics.Register(reg, m.stages); err != nil {
		return nil, err
	}
	if m.replayAge, err = gatemetrics.Register(reg, m.replayAge); err != nil {
		return nil, err
	}
	if m.calls, err = gatemetrics.Register(reg, m.calls); err != nil {
		return nil, err
	}
	if m.events, err = gatemetrics.Register(reg, m.events); err != nil {
		return nil, err
	}
	return m, nil
}

// stage observes that a call of method spent d in stage.
func (m *metrics) stage(method, stage string, d time.Duration) {
	if m != nil {
		m.stages.WithLabelValues(method, stage).Observe(d.Seconds())
	}
}

// event counts in idemgate_interceptor_events_total an event the core
// reports for method; m may be nil (no registerer).

func (m *metrics) event(method, event string) {
	if m != nil {
		m.events.WithLabelValues(method, event).Inc()
	}
}

// countCall counts a gated call's outcome: executed, replayed, or the
// reason it was refused (lower-cased, IDEMPOTENCY_ dropped).
func (g *Gate) countCall(fullMethod, outcome string, err error) {
	if g.metrics == nil {
		return
	}
	if outcome == "" {
		outcome = reasonLabel(grpcerr.Reason(err))
	}
	g.metrics.calls.WithLabelValues(fullMethod, outcome).Inc()
}

// reasonLabel turns one of the interceptor's reasons into a label:
// IDEMPOTENCY_KEY_MISSING becomes key_missing. Any other error (the tenant
// function's, whatever reason it carries) is "refused", so the label's
// values stay a small fixed set.
func reasonLabel(reason string) string {
	if !interceptorReasons[reason] {
		return "refused"
	}
	return strings.ToLower(strings.TrimPrefix(reason, "IDEMPOTENCY_"))
}

var interceptorReasons = map[string]bool{
	idemgate.ReasonKeyMissing: true, idemgate.ReasonKeyInvalid: true, idemgate.ReasonKeyConflict: true, idemgate.ReasonKeyReused: true,
	idemgate.ReasonInFlight: true, idemgate.ReasonOutcomeUnknown: true, idemgate.ReasonResultTooLarge: true, idemgate.ReasonStoreUnavailable: true,
	idemgate.ReasonStoreRejected: true, idemgate.ReasonOutcomeTypeMismatch: true, idemgate.ReasonQuotaExceeded: true,
}
