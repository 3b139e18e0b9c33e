package console

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The service's own metrics the Activity page reads (dedupesvc.Metrics,
// auth.Authenticator, internal/dedupeapp's pre-authentication gate).
const (
	rpcMetric     = "idemgate_dedupe_rpc_duration_seconds"
	stageMetric   = "idemgate_dedupe_stage_seconds"
	outcomeMetric = "idemgate_dedupe_outcomes_total"
	authMetric    = "idemgate_dedupe_auth_refusals_total"
	streamsMetric = "idemgate_dedupe_unauthenticated_streams_refused_total"
)

// ActivityWindow is how far back the Activity page reaches: the sampler
// keeps this long of intervals in a fixed ring and drops older ones.
const ActivityWindow = 10 * time.Minute

// maxIntervals bounds the ring whatever Config.ActivityInterval is.
const maxIntervals = 600

// hist is one histogram's cumulative bucket counts as gathered.
type hist struct {
	// bounds are the finite upper bounds, ascending; cum the cumulative
	// count of each; count all observations (+Inf included).
	bounds []float64
	cum    []uint64
	count  uint64
}

// reading is one gathering of the counters the page draws, cumulative
// since the service started.
type reading struct {
	at       time.Time
	rpcs     map[string]hist // by rpc
	stages   map[string]hist // by "rpc stage"
	refusals map[string]float64
}

// latency is one RPC's calls and latency over an interval.
type latency struct {
	// Calls were observed in the interval; PerSecond is Calls over its
	// length. P50 and P99 are in seconds, NaN without calls.
	Calls, PerSecond, P50, P99 float64
}

// interval is what happened between two readings.
type interval struct {
	From, To time.Time
	RPCs     map[string]latency
	// Refusals are per second, by reason.
	Refusals map[string]float64
	// stages are the stage histograms' bucket deltas, summed over the
	// window for the stage table.
	stages map[string]hist
}

// activity samples the service's counters every interval into a ring of
// the last ActivityWindow, off the request path: a page copies the ring
// under mu and never gathers.
type activity struct {
	gatherer prometheus.Gatherer
	every    time.Duration
	logger   *slog.Logger

	mu   sync.Mutex
	prev reading
	ring []interval // fixed length; next is where the next interval goes
	next int
	n    int
	// lastErr is the last gathering error logged.
	lastErr string

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// newActivity takes a first reading now, so the first interval exists
// after one period, and starts sampling every period until close; nil
// without a gatherer or with a negative period.
func newActivity(g prometheus.Gatherer, every time.Duration, logger *slog.Logger) *activity {
	if g == nil || every < 0 {
		return nil
	}
	size := min(max(int(ActivityWindow/every), 1), maxIntervals)
	a := &activity{gatherer: g, every: every, logger: logger, ring: make([]interval, size),
		stop: make(chan struct{}), done: make(chan struct{})}
	a.sample(time.Now())
	go a.run()
	return a
}

func (a *activity) run() {
	defer close(a.done)
	t := time.NewTicker(a.every)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case now := <-t.C:
			a.sample(now)
		}
	}
}

// close stops the sampler and waits for it; safe on nil and twice.
func (a *activity) close() {
	if a == nil {
		return
	}
	a.stopOnce.Do(func() { close(a.stop) })
	<-a.done
}

// sample reads the counters as of at and adds the interval since the last
// reading. Gathering happens outside mu, so a page never waits for it.
func (a *activity) sample(at time.Time) {
	families, err := a.gatherer.Gather()
	cur := readingOf(families, at)
	a.mu.Lock()
	defer a.mu.Unlock()
	// A partial gathering still has the families that worked; the same
	// failure every interval is logged once.
	if msg := fmt.Sprint(err); err != nil && msg != a.lastErr {
		a.logger.Warn("console: reading the service's metrics failed", slog.Any("error", err))
		a.lastErr = msg
	} else if err == nil {
		a.lastErr = ""
	}
	if !a.prev.at.IsZero() && !at.After(a.prev.at) {
		return // overtaken by a later reading (a test's, beside a tick)
	}
	if !a.prev.at.IsZero() {
		a.ring[a.next] = intervalOf(a.prev, cur)
		a.next = (a.next + 1) % len(a.ring)
		a.n = min(a.n+1, len(a.ring))
	}
	a.prev = cur
}

// snapshot returns the intervals kept, oldest first.
func (a *activity) snapshot() []interval {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]interval, 0, a.n)
	for i := range a.n {
		out = append(out, a.ring[(a.next-a.n+i+len(a.ring))%len(a.ring)])
	}
	return out
}

// readingOf picks the page's counters out of a gathering. Refusal reasons
// are named after their counter: quota refusals by quota, authentication
// refusals by reason, malformed requests, health checks refused to
// connections that had not authenticated.
func readingOf(families []*dto.MetricFamily, at time.Time) reading {
	r := reading{at: at, rpcs: map[string]hist{}, stages: map[string]hist{}, refusals: map[string]float64{}}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case rpcMetric:
				r.rpcs[label(m, "rpc")] = histOf(m.GetHistogram())
			case stageMetric:
				r.stages[label(m, "rpc")+" "+label(m, "stage")] = histOf(m.GetHistogram())
			case quotaMetric:
				r.refusals["quota "+label(m, "quota")] += m.GetCounter().GetValue()
			case authMetric:
				r.refusals["authentication "+label(m, "reason")] += m.GetCounter().GetValue()
			case streamsMetric:
				r.refusals["unauthenticated health check"] += m.GetCounter().GetValue()
			case outcomeMetric:
				if label(m, "outcome") == "invalid" {
					r.refusals["invalid request"] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return r
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func histOf(h *dto.Histogram) hist {
	out := hist{count: h.GetSampleCount()}
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), +1) {
			continue
		}
		out.bounds = append(out.bounds, b.GetUpperBound())
		out.cum = append(out.cum, b.GetCumulativeCount())
	}
	return out
}

// intervalOf is what the counters moved between prev and cur.
func intervalOf(prev, cur reading) interval {
	secs := cur.at.Sub(prev.at).Seconds()
	iv := interval{From: prev.at, To: cur.at, RPCs: map[string]latency{}, Refusals: map[string]float64{}, stages: map[string]hist{}}
	for rpc, h := range cur.rpcs {
		d := deltaOf(prev.rpcs[rpc], h)
		iv.RPCs[rpc] = latency{Calls: float64(d.count), PerSecond: float64(d.count) / secs, P50: quantile(0.5, d), P99: quantile(0.99, d)}
	}
	for stage, h := range cur.stages {
		iv.stages[stage] = deltaOf(prev.stages[stage], h)
	}
	for reason, v := range cur.refusals {
		d := v - prev.refusals[reason]
		if d < 0 { // reset: count from zero
			d = v
		}
		iv.Refusals[reason] = d / secs
	}
	return iv
}

// deltaOf is cur less prev, bucket by bucket; cur itself when prev is
// missing, has other buckets or is larger (the histogram was reset).
func deltaOf(prev, cur hist) hist {
	if prev.count > cur.count || !slices.Equal(prev.bounds, cur.bounds) {
		return cur
	}
	d := hist{bounds: cur.bounds, cum: make([]uint64, len(cur.cum)), count: cur.count - prev.count}
	for i := range cur.cum {
		if prev.cum[i] > cur.cum[i] {
			return cur
		}
		d.cum[i] = cur.cum[i] - prev.cum[i]
	}
	return d
}

// sumHist sums two deltas of the same histogram; an a of other buckets is
// replaced.
func sumHist(a, b hist) hist {
	if a.count == 0 || !slices.Equal(a.bounds, b.bounds) {
		return b
	}
	s := hist{bounds: b.bounds, cum: slices.Clone(a.cum), count: a.count + b.count}
	for i := range s.cum {
		s.cum[i] += b.cum[i]
	}
	return s
}

// quantile estimates the q-quantile of h as Prometheus's
// histogram_quantile does: linear within the bucket the rank falls in (from
// 0 in the first), the highest finite bound when it falls past them all;
// NaN without observations.
func quantile(q float64, h hist) float64 {
	if h.count == 0 || len(h.bounds) == 0 {
		return math.NaN()
	}
	rank := q * float64(h.count)
	i := sort.Search(len(h.cum), func(i int) bool { return float64(h.cum[i]) >= rank })
	if i == len(h.cum) {
		return h.bounds[len(h.bounds)-1]
	}
	lower, below := 0.0, uint64(0)
	if i > 0 {
		lower, below = h.bounds[i-1], h.cum[i-1]
	}
	in := h.cum[i] - below
	if in == 0 {
		return h.bounds[i]
	}
	return lower + (h.bounds[i]-lower)*(rank-float64(below))/float64(in)
}
