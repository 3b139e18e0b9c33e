package dedupesvc

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome labels of idemgate_dedupe_outcomes_total.
const (
	outcomeReserved    = "reserved"     // Begin reserved the key
	outcomeReplayed    = "replayed"     // Begin answered a stored outcome
	outcomeInFlight    = "in_flight"    // Begin answered in flight (after any wait)
	outcomeWaited      = "waited"       // Begin waited for an in-flight outcome
	outcomeMismatched  = "mismatched"   // Begin found the key used with another request
	outcomeUnknown     = "unknown"      // Begin found the outcome lost
	outcomeFinished    = "finished"     // Finish stored an outcome
	outcomeReleased    = "released"     // Release freed a reservation
	outcomeResolved    = "resolved"     // Resolve settled an unknown outcome
	outcomeFenced      = "fenced"       // Finish, Release or Heartbeat from a stale holder
	outcomeStoreErrors = "store_errors" // the store failed
	outcomeInvalid     = "invalid"      // the request was refused as malformed
)

var allOutcomes = []string{
	outcomeReserved, outcomeReplayed, outcomeInFlight, outcomeWaited, outcomeMismatched, outcomeUnknown,
	outcomeFinished, outcomeReleased, outcomeResolved, outcomeFenced, outcomeStoreErrors, outcomeInvalid,
}

// Metrics are the Dedupe service's Prometheus metrics: a counter per outcome
// (idemgate_dedupe_outcomes_total{outcome}), a counter per quota a caller
// hit (idemgate_dedupe_quota_exceeded_total{quota}: rate, records, bytes,
// retention, waiters), the latency of each RPC, store time and waiting
// included (idemgate_dedupe_rpc_duration_seconds{rpc}), the replays served
// per method (idemgate_dedupe_replays_total{method}), where Begin and Finish
// spend their time (idemgate_dedupe_stage_seconds{rpc,stage}), the replays a
// ReplayRecorder could not record (idemgate_dedupe_replay_counts_dropped_total),
// the compaction lag of the quota usage (idemgate_usage_compaction_lag_seconds,
// set by RunUsageCompactionWith) and the records operators forgot
// (idemgate_dedupe_records_forgotten_total{state,forced}).
// Register it with a prometheus.Registerer and pass it to WithMetrics.
type Metrics struct {
	outcomes  *prometheus.CounterVec
	quotas    *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	stages    *prometheus.HistogramVec
	replays   *prometheus.CounterVec
	dropped   prometheus.Counter
	forgotten *prometheus.CounterVec
	usageLag  prometheus.Gauge

	methodsMu sync.Mutex
	methods   map[string]bool // the method labels of replays in use
	// claimed counts the labels each caller (namespace) added to methods:
	// at most MaxReplayMethods callers, as each added one.
	claimed map[string]int
}

// StageBuckets are the upper bounds, in seconds, of
// idemgate_dedupe_stage_seconds: from a check that takes microseconds to a
// statement queued behind a slow commit.
var StageBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}

// MaxReplayMethods bounds the method labels of idemgate_dedupe_replays_total:
// callers choose scopes, so the methods seen are bounded here rather than by
// the protos. Replays of methods past the first MaxReplayMethods are counted
// under "other".
const MaxReplayMethods = 500

// MaxReplayMethodsPerCaller bounds the method labels one caller (the
// namespace its credentials name; every caller is one without
// authentication) may add to idemgate_dedupe_replays_total: one caller
// replaying made-up scopes takes its share, not every label, so the
// methods other callers replay later keep theirs until five callers have
// each taken a share. A method another caller added first is counted under
// its own label whoever replays it.
const MaxReplayMethodsPerCaller = 100

// OtherMethod is the method label of replays past MaxReplayMethods methods.
const OtherMethod = "other"

var _ prometheus.Collector = (*Metrics)(nil)

// NewMetrics returns the metrics, every outcome counter at zero.
func NewMetrics() *Metrics {
	m := &Metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_dedupe_outcomes_total",
			Help: "Dedupe service answers by outcome.",
		}, []string{"outcome"}),
		quotas: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_dedupe_quota_exceeded_total",
			Help: "Dedupe requests refused or not waited for because the caller hit a quota, by quota.",
		}, []string{"quota"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemgate_dedupe_rpc_duration_seconds",
			Help:    "Dedupe RPC latency in seconds, store and waiting included.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"rpc"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemgate_dedupe_stage_seconds",
			Help:    "Where Begin and Finish spend their time in the service, by rpc and stage: checks, queue (waiting for a group-commit writer), statement (the batch's round trip and commit), store (the rest of the store), wait (for an in-flight outcome), reply.",
			Buckets: StageBuckets,
		}, []string{"rpc", "stage"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_dedupe_replays_total",
			Help: "Duplicates answered with a stored outcome (suppressed executions), by method (the scope's action; at most 100 methods added by each caller and 500 in all, then \"other\").",
		}, []string{"method"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemgate_dedupe_replay_counts_dropped_total",
			Help: "Replays served but not added to their records' replay counts: the recorder was full or a flush failed.",
		}),
		forgotten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_dedupe_records_forgotten_total",
			Help: "Records an operator forgot (AdminService.ForgetRecord), by the state they were in and whether forced.",
		}, []string{"state", "forced"}),
		usageLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemgate_usage_compaction_lag_seconds",
			Help: "Age of the oldest quota usage change not yet added to the totals, as the last compaction round measured it (PostgreSQL store; 0 on the embedded store, which keeps its totals exact): about the compaction interval when it keeps up.",
		}),
		methods: map[string]bool{},
		claimed: map[string]int{},
	}
	for _, o := range allOutcomes {
		m.outcomes.WithLabelValues(o)
	}
	for _, q := range allQuotas {
		m.quotas.WithLabelValues(q)
	}
	for _, rpc := range []string{"Begin", "Finish"} {
		for _, stage := range allStages {
			m.stages.WithLabelValues(rpc, stage)
		}
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.outcomes.Describe(ch)
	m.quotas.Describe(ch)
	m.latency.Describe(ch)
	m.stages.Describe(ch)
	m.replays.Describe(ch)
	m.dropped.Describe(ch)
	m.forgotten.Describe(ch)
	m.usageLag.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.outcomes.Collect(ch)
	m.quotas.Collect(ch)
	m.latency.Collect(ch)
	m.stages.Collect(ch)
	m.replays.Collect(ch)
	m.dropped.Collect(ch)
	m.forgotten.Collect(ch)
	m.usageLag.Collect(ch)
}

// replay counts a replay served to the caller of namespace for scope's
// method.
func (m *Metrics) replay(namespace, scope string) {
	if m == nil {
		return
	}
	method := MethodOf(scope)
	m.methodsMu.Lock()
	if !m.methods[method] {
		if len(m.methods) >= MaxReplayMethods || m.claimed[namespace] >= MaxReplayMethodsPerCaller {
			method = OtherMethod
		} else {
			m.methods[method] = true
			m.claimed[namespace]++
		}
	}
	m.methodsMu.Unlock()
	m.replays.WithLabelValues(method).Inc()
}

// replayCountsDropped counts n replays that did not reach their records.
func (m *Metrics) replayCountsDropped(n int64) {
	if m != nil {
		m.dropped.Add(float64(n))
	}
}

// forgot counts a record an operator forgot, by its state before.
func (m *Metrics) forgot(state string, forced bool) {
	if m != nil {
		m.forgotten.WithLabelValues(state, strconv.FormatBool(forced)).Inc()
	}
}

func (m *Metrics) count(outcome string) {
	if m != nil {
		m.outcomes.WithLabelValues(outcome).Inc()
	}
}

// countN counts n of outcome.
func (m *Metrics) countN(outcome string, n int) {
	if m != nil && n > 0 {
		m.outcomes.WithLabelValues(outcome).Add(float64(n))
	}
}

// observe records an RPC's latency; call it deferred with the start time.
func (m *Metrics) observe(rpc string, start time.Time) {
	if m != nil {
		m.latency.WithLabelValues(rpc).Observe(time.Since(start).Seconds())
	}
}

// WithMetrics makes the service count its outcomes and time its RPCs in m.
// Defaults to none.
func WithMetrics(m *Metrics) Option {
	return func(o *options) { o.metrics = m }
}

// quota counts a caller hitting quota.
func (m *Metrics) quota(quota string) {
	if m != nil {
		m.quotas.WithLabelValues(quota).Inc()
	}
}

// QuotaCounter returns the counter of idemgate_dedupe_quota_exceeded_total
// for quota, for tests and dashboards built in Go.
func (m *Metrics) QuotaCounter(quota string) prometheus.Counter {
	return m.quotas.WithLabelValues(quota)
}

// ReplayCountsDropped returns idemgate_dedupe_replay_counts_dropped_total,
// for tests and dashboards built in Go.
func (m *Metrics) ReplayCountsDropped() prometheus.Counter { return m.dropped }

// ForgottenCounter returns the counter of
// idemgate_dedupe_records_forgotten_total for records forgotten in state,
// forced or not, for tests and dashboards built in Go.
func (m *Metrics) ForgottenCounter(state string, forced bool) prometheus.Counter {
	return m.forgotten.WithLabelValues(state, strconv.FormatBool(forced))
}
