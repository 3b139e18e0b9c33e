package console

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// fakeService is a registry holding the service's metric names with
// buckets the tests choose, filled by hand: the service's counters as the
// console gathers them, with exact values.
type fakeService struct {
	registry *prometheus.Registry
	rpcs     *prometheus.HistogramVec
	stages   *prometheus.HistogramVec
	quotas   *prometheus.CounterVec
	auth     *prometheus.CounterVec
	outcomes *prometheus.CounterVec
}

func newFakeService() *fakeService {
	buckets := []float64{.001, .01, .1}
	f := &fakeService{registry: prometheus.NewRegistry(),
		rpcs:     prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: rpcMetric, Buckets: buckets}, []string{"rpc"}),
		stages:   prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: stageMetric, Buckets: buckets}, []string{"rpc", "stage"}),
		quotas:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: quotaMetric}, []string{"quota"}),
		auth:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: authMetric}, []string{"reason"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: outcomeMetric}, []string{"outcome"}),
	}
	f.registry.MustRegister(f.rpcs, f.stages, f.quotas, f.auth, f.outcomes)
	f.quotas.WithLabelValues("records")
	f.outcomes.WithLabelValues("replayed").Add(7) // not a refusal
	return f
}

// observe records n calls of rpc that took d.
func (f *fakeService) observe(rpc string, n int, d float64) {
	for range n {
		f.rpcs.WithLabelValues(rpc).Observe(d)
		f.stages.WithLabelValues(rpc, dedupesvc.StageStatement).Observe(d)
	}
}

// testActivity samples g by hand: no goroutine, so every sample is the
// test's, at the time it says.
func testActivity(g prometheus.Gatherer, size int) *activity {
	return &activity{gatherer: g, every: 10 * time.Second, logger: slog.Default(), ring: make([]interval, size)}
}

func near(got, want float64) bool { return math.Abs(got-want) < 1e-9 }

// Calls per second, p50 and p99 (linear within the bucket, from the
// bucket deltas of each interval only) and refusals per second by reason.
func TestActivityRatesAndPercentilesFromBucketDeltas(t *testing.T) {
	f := newFakeService()
	// Before the console started: not in any interval.
	f.observe("Begin", 1000, 0.5)
	f.quotas.WithLabelValues("rate").Add(100)
	a := testActivity(f.registry, 3)
	t0 := time.Date(2026, 12, 7, 21, 0, 0, 0, time.UTC)
	a.sample(t0)
	if got := a.snapshot(); len(got) != 0 {
		t.Fatalf("one reading made %d intervals, want none", len(got))
	}

	// 100 Begins in 10 s: 50 under 1 ms, 40 under 10 ms, 10 under 100 ms;
	// 30 rate refusals, 5 invalid tokens, 2 malformed requests.
	f.observe("Begin", 50, 0.0005)
	f.observe("Begin", 40, 0.005)
	f.observe("Begin", 10, 0.05)
	f.observe("Finish", 4, 0.002)
	f.quotas.WithLabelValues("rate").Add(30)
	f.auth.WithLabelValues("invalid_token").Add(5)
	f.outcomes.WithLabelValues("invalid").Add(2)
	a.sample(t0.Add(10 * time.Second))
	// 20 Begins in 5 s, all between 10 and 100 ms, and one past every
	// bucket; nothing refused.
	f.observe("Begin", 20, 0.05)
	f.observe("Finish", 1, 2)
	a.sample(t0.Add(15 * time.Second))

	ivs := a.snapshot()
	if len(ivs) != 2 {
		t.Fatalf("%d intervals, want 2", len(ivs))
	}
	first, second := ivs[0], ivs[1]
	if !first.From.Equal(t0) || !first.To.Equal(t0.Add(10*time.Second)) || !second.From.Equal(first.To) {
		t.Errorf("intervals %v-%v, %v-%v", first.From, first.To, second.From, second.To)
	}
	for _, tt := range []struct {
		name      string
		got       latency
		calls     float64
		perSecond float64
		p50, p99  float64
	}{
		// p50: rank 50 ends the first bucket, 1 ms. p99: rank 99 is 9 of
		// the 10 in (10 ms, 100 ms]: 10 + 90*9/10 = 91 ms.
		{"Begin, first", first.RPCs["Begin"], 100, 10, 0.001, 0.091},
		// Rank 2 of 4 in (1 ms, 10 ms]: 1 + 9*2/4 = 5.5 ms; rank 3.96:
		// 1 + 9*3.96/4 = 9.91 ms.
		{"Finish, first", first.RPCs["Finish"], 4, 0.4, 0.0055, 0.00991},
		// Only this interval's 20: rank 10 of 20 in (10 ms, 100 ms]:
		// 10 + 90*10/20 = 55 ms; rank 19.8: 99.1 ms.
		{"Begin, second", second.RPCs["Begin"], 20, 4, 0.055, 0.0991},
		// Past every bucket: the highest finite bound, as histogram_quantile.
		{"Finish, second", second.RPCs["Finish"], 1, 0.2, 0.1, 0.1},
	} {
		if tt.got.Calls != tt.calls || !near(tt.got.PerSecond, tt.perSecond) || !near(tt.got.P50, tt.p50) || !near(tt.got.P99, tt.p99) {
			t.Errorf("%s: %+v, want %v calls, %v/s, p50 %v, p99 %v", tt.name, tt.got, tt.calls, tt.perSecond, tt.p50, tt.p99)
		}
	}
	for reason, want := range map[string]float64{"quota rate": 3, "authentication invalid_token": 0.5, "invalid request": 0.2, "quota records": 0} {
		if got := first.Refusals[reason]; !near(got, want) {
			t.Errorf("first interval: %s %v/s, want %v", reason, got, want)
		}
		if got := second.Refusals[reason]; got != 0 {
			t.Errorf("second interval: %s %v/s, want 0", reason, got)
		}
	}
	if len(first.Refusals) != 4 {
		t.Errorf("refusal reasons %v, want the 4 counted (a replay is not one)", first.Refusals)
	}

	// The stage table sums the intervals' deltas: Begin's statement stage
	// had 120 calls in the window (50, 40, 30 by bucket), its p50 rank 60:
	// 1 + 9*10/40 = 3.25 ms; p99 rank 118.8: 10 + 90*28.8/30 = 96.4 ms.
	stages := stageRows(ivs)
	if len(stages) != 2 || stages[0] != (stageRow{RPC: "Begin", Stage: "statement", Calls: 120, P50: "3.25 ms", P99: "96.4 ms"}) ||
		stages[1].RPC != "Finish" || stages[1].Calls != 5 {
		t.Errorf("stage rows %+v", stages)
	}

	// The ring keeps its size: the oldest intervals go.
	for i := range 4 {
		a.sample(t0.Add(time.Duration(20+5*i) * time.Second))
	}
	ivs = a.snapshot()
	if len(ivs) != 3 || !ivs[0].From.Equal(t0.Add(20*time.Second)) || !ivs[2].To.Equal(t0.Add(35*time.Second)) {
		t.Fatalf("after 6 intervals in a ring of 3: %d, from %v to %v", len(ivs), ivs[0].From, ivs[len(ivs)-1].To)
	}
	if l := ivs[2].RPCs["Begin"]; l.Calls != 0 || !math.IsNaN(l.P50) {
		t.Errorf("an interval without calls: %+v, want 0 calls and no percentile", l)
	}
}

// A histogram or counter that went back (reset) counts from zero.
func TestActivityDeltaAfterAReset(t *testing.T) {
	prev := hist{bounds: []float64{1, 2}, cum: []uint64{5, 9}, count: 10}
	cur := hist{bounds: []float64{1, 2}, cum: []uint64{1, 2}, count: 2}
	if d := deltaOf(prev, cur); d.count != 2 || d.cum[1] != 2 {
		t.Errorf("delta after a reset %+v, want the current counts", d)
	}
	iv := intervalOf(reading{at: time.Unix(0, 0), refusals: map[string]float64{"quota rate": 50}},
		reading{at: time.Unix(10, 0), refusals: map[string]float64{"quota rate": 20}})
	if got := iv.Refusals["quota rate"]; got != 2 {
		t.Errorf("refusals after a reset %v/s, want 2", got)
	}
}

// admitAll lets every request in as the admin "oncall".
type admitAll struct{}

func (admitAll) Authenticate(context.Context) (dedupesvc.Caller, error) {
	return dedupesvc.Caller{Name: "oncall", Admin: true}, nil
}

// The Activity page draws a chart per series and a table of the same
// numbers once intervals exist; before, it says when the first comes.
func TestActivityPageDrawsTheSamples(t *testing.T) {
	f := newFakeService()
	c, err := New(Config{Admin: idemgatev1.UnimplementedAdminServiceServer{}, Authenticator: admitAll{}, Metrics: f.registry, ActivityInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	c.activity = testActivity(f.registry, 60) // sampled by hand below
	op := operator{caller: dedupesvc.Caller{Name: "oncall", Admin: true}, session: &session{csrf: "csrf"}}
	get := func() string {
		w := httptest.NewRecorder()
		c.activityPage(w, httptest.NewRequest("GET", "/activity", nil), op)
		if w.Code != 200 {
			t.Fatalf("activity page: %d\n%s", w.Code, w.Body)
		}
		return w.Body.String()
	}
	t0 := time.Date(2026, 12, 7, 21, 0, 0, 0, time.UTC)
	c.activity.sample(t0)
	if page := get(); !strings.Contains(page, `id="activity-none"`) || strings.Contains(page, "<svg") {
		t.Fatalf("activity page before an interval:\n%s", page)
	}
	f.observe("Begin", 50, 0.0005)
	f.observe("Begin", 40, 0.005)
	f.observe("Begin", 10, 0.05)
	f.quotas.WithLabelValues("rate").Add(30)
	c.activity.sample(t0.Add(10 * time.Second))
	f.observe("Begin", 20, 0.05)
	c.activity.sample(t0.Add(20 * time.Second))
	page := get()
	for _, id := range []string{"chart-calls", "chart-begin", "chart-finish", "chart-refusals"} {
		if !strings.Contains(page, `<figure class="chart" id="`+id+`">`) {
			t.Errorf("no chart %s", id)
		}
	}
	// Calls: Begin at 10/s then 2/s on a scale to 10 (x from 52 to 392 over
	// 20 s, y from 98 to 10); Finish never called, 0/s along the bottom.
	for _, want := range []string{
		`<polyline class="line s1" points="222.0,10.0 392.0,80.4"/>`,
		`<polyline class="line s2" points="222.0,98.0 392.0,98.0"/>`,
		`<text class="end" x="48" y="14">10.0/s</text>`,
		`<text x="52" y="116">21:00:00</text><text class="end" x="392" y="116">21:00:20</text>`,
		// The table, newest first: Begin 2/s, p50 55 ms, p99 99.1 ms; Finish
		// without calls; the rate refusals 3/s in the first interval.
		`<th scope="row">21:00:20</th><td>2.00</td><td>55.0 ms</td><td>99.1 ms</td><td>0</td><td>-</td><td>-</td><td>0</td><td>0</td></tr>`,
		`<th scope="row">21:00:10</th><td>10.0</td><td>1.00 ms</td><td>91.0 ms</td><td>0</td><td>-</td><td>-</td><td>3.00</td><td>3.00</td></tr>`,
		`<th scope="col">quota rate /s</th>`,
		`Refusals in the window: quota rate.`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("no %s in the page", want)
		}
	}
	if regexp.MustCompile(`style=|<script`).MatchString(page) {
		t.Errorf("inline style or script in the page, which the CSP forbids")
	}
	if t.Failed() {
		t.Log(page)
	}
}

// Without a registry, or with sampling off, the page says so and nothing
// samples.
func TestActivityOff(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "given no metrics registry"},
		{Config{Metrics: prometheus.NewRegistry(), ActivityInterval: -1}, "Sampling is off"},
	} {
		tt.cfg.Admin, tt.cfg.Authenticator = idemgatev1.UnimplementedAdminServiceServer{}, admitAll{}
		c, err := New(tt.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if c.activity != nil {
			t.Errorf("%s: a sampler runs", tt.want)
		}
		if got := c.activityData().Off; !strings.Contains(got, tt.want) {
			t.Errorf("activity page says %q, want %q", got, tt.want)
		}
		c.Close()
		c.Close()
	}
}

// The names read are the service's own: its metrics and its
// authenticator's refusals, gathered from a registry as
// internal/dedupeapp builds it, give the stages and the refusal reasons.
func TestActivityReadsTheServicesMetricNames(t *testing.T) {
	registry := prometheus.NewRegistry()
	authn, err := auth.New(auth.Config{Tokens: []auth.Token{{Name: "oncall", Secret: "oncall-secret-0123456789", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	registry.MustRegister(dedupesvc.NewMetrics(), authn)
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	r := readingOf(families, time.Now())
	for _, reason := range []string{"quota rate", "quota records", "quota bytes", "authentication invalid_token", "authentication missing_credentials", "invalid request"} {
		if _, ok := r.refusals[reason]; !ok {
			t.Errorf("no refusal reason %q in %v", reason, r.refusals)
		}
	}
	for _, stage := range []string{"Begin checks", "Begin statement", "Finish reply"} {
		if h, ok := r.stages[stage]; !ok || !slices.Equal(h.bounds, dedupesvc.StageBuckets) {
			t.Errorf("stage %q: %+v, %v", stage, h, ok)
		}
	}
}

// A reading older than the last (a tick overtaken by another reading) is
// dropped; a gathering that fails keeps what it read and logs the failure
// once, not every interval.
func TestActivityOvertakenAndFailedReadings(t *testing.T) {
	f := newFakeService()
	var logs strings.Builder
	failing := true
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		families, _ := f.registry.Gather()
		if failing {
			return families, errors.New("a collector failed")
		}
		return families, nil
	})
	a := testActivity(g, 10)
	a.logger = slog.New(slog.NewTextHandler(&logs, nil))
	t0 := time.Unix(1000, 0)
	a.sample(t0)
	f.observe("Begin", 10, 0.0005)
	a.sample(t0.Add(10 * time.Second))
	a.sample(t0.Add(5 * time.Second))
	f.observe("Begin", 5, 0.0005)
	a.sample(t0.Add(20 * time.Second))
	ivs := a.snapshot()
	if len(ivs) != 2 || !ivs[1].From.Equal(t0.Add(10*time.Second)) || ivs[0].RPCs["Begin"].Calls != 10 || ivs[1].RPCs["Begin"].Calls != 5 {
		t.Fatalf("intervals %+v, want 0-10s with 10 calls and 10-20s with 5", ivs)
	}
	if n := strings.Count(logs.String(), "a collector failed"); n != 1 {
		t.Errorf("the same failure logged %d times, want once:\n%s", n, logs.String())
	}
}
