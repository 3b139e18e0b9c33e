package httpgate

import (
	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatemetrics"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Prometheus collectors of WithRegisterer; nil without a
// registerer, and every method is a no-op on nil.
type metrics struct {
	requests, events *prometheus.CounterVec
	stages, age      *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_httpgate_requests_total",
			Help: "Gated HTTP requests by route pattern and outcome: executed (stored), released (not an outcome: a retry runs again), replayed, or the reason they were refused.",
		}, []string{"route", "outcome"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_httpgate_events_total",
			Help: "Events the caller does not see, by route pattern: fenced, finish_retry, outcome_lost, release_retry, release_failure, heartbeat_failure, reconciled, result_too_large, begin_lost, replay_cache_hit, replay_cache_miss.",
		}, []string{"route", "event"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemgate_httpgate_stage_seconds",
			Help:    "Where a gated request's time goes, by route pattern and stage: prepare (key, body, fingerprint), begin (the Dedupe round trip), handler (with the gate's encoding of its answer), finish (storing the outcome before the reply).",
			Buckets: idemgate.StageBuckets,
		}, []string{"route", "stage"}),
		age: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemgate_httpgate_replay_age_seconds",
			Help:    "Age of each outcome answered from storage instead of running the handler: seconds since it was stored, by route pattern.",
			Buckets: idemgate.ReplayAgeBuckets,
		}, []string{"route"}),
	}
	var err error
	if m.requests, err = gatemetrics.Register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.events, err = gatemetrics.Register(reg, m.events); err != nil {
		return nil, err
	}
	if m.stages, err = gatemetrics.Register(reg, m.stages); err != nil {
		return nil, err
	}
	if m.age, err = gatemetrics.Register(reg, m.age); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) event(route, event string) {
	if m != nil {
		m.events.WithLabelValues(route, event).Inc()
	}
}

func (m *metrics) stage(route, stage string, d time.Duration) {
	if m != nil {
		m.stages.WithLabelValues(route, stage).Observe(d.Seconds())
	}
}

func (m *metrics) replayed(route string, completedAt time.Time) {
	if m != nil {
		m.age.WithLabelValues(route).Observe(max(time.Since(completedAt), 0).Seconds())
	}
}

// request counts a request that got a response: executed, released or
// replayed.
func (m *metrics) request(route, outcome string) {
	if m != nil {
		m.requests.WithLabelValues(route, outcome).Inc()
	}
}

// refused counts a refusal by its reason, lower-cased without IDEMPOTENCY_
// ("refused" without one).
func (m *metrics) refused(route, reason string) {
	if m == nil {
		return
	}
	outcome := "refused"
	if _, ok := refusals[reason]; ok {
		outcome = strings.ToLower(strings.TrimPrefix(reason, "IDEMPOTENCY_"))
	}
	m.requests.WithLabelValues(route, outcome).Inc()
}
