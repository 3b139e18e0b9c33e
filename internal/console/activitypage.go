package console

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

// chartedRPCs are the RPCs drawn: every gated call is a Begin, and a Finish
// when it ran.
var chartedRPCs = []string{"Begin", "Finish"}

// stageOrder is the order of a call's stages, for the stage table.
var stageOrder = []string{dedupesvc.StageChecks, dedupesvc.StageQueue, dedupesvc.StageStatement, dedupesvc.StageStore, dedupesvc.StageWait, dedupesvc.StageReply}

// The charts' geometry in SVG user units, in a 400x124 viewBox: the plot
// inside, labels around (templates/activity.html draws the axes and labels
// at these numbers).
const (
	plotLeft, plotRight = 52.0, 392.0
	plotTop, plotBottom = 10.0, 98.0
	seriesClasses       = 4
	timeLabel           = "15:04:05"
	noValue             = "-"
)

// chart is one small line chart, drawn as inline SVG (no script; the CSP
// allows it) with its labels as text.
type chart struct {
	ID, Title string
	// YMax labels the top of the plot, XFrom and XTo its ends (UTC).
	YMax, XFrom, XTo string
	Series           []series
	// Empty says the chart has no value above zero.
	Empty bool
}

type series struct {
	Name, Class string
	// Lines are polyline points, one per run of intervals with a value;
	// Dots mark the values of runs of one.
	Lines []string
	Dots  []point
	// Last is the newest interval's value, formatted.
	Last string
}

type point struct{ X, Y string }

// stageRow is one stage's latency over the window.
type stageRow struct {
	RPC, Stage string
	Calls      uint64
	P50, P99   string
}

type activityPage struct {
	// Off says why nothing is sampled, when nothing is.
	Off    string
	Every  time.Duration
	Window time.Duration
	// From and To are the intervals' span (UTC), empty before the first.
	From, To string
	Charts   []chart
	// Header and Rows are the charts' numbers, newest interval first.
	Header []string
	Rows   [][]string
	// Reasons are the refusal reasons with refusals in the window.
	Reasons []string
	Stages  []stageRow
}

func (c *Console) activityPage(w http.ResponseWriter, r *http.Request, op operator) {
	c.render(w, http.StatusOK, "activity", c.page(op, "Activity", c.activityData()))
}

func (c *Console) activityData() activityPage {
	data := activityPage{Every: c.cfg.ActivityInterval, Window: ActivityWindow}
	switch {
	case c.cfg.Metrics == nil:
		data.Off = "The console was given no metrics registry: nothing is sampled."
		return data
	case c.activity == nil:
		data.Off = "Sampling is off (a negative Config.ActivityInterval)."
		return data
	}
	ivs := c.activity.snapshot()
	if len(ivs) == 0 {
		return data
	}
	data.From, data.To = ivs[0].From.UTC().Format(timeLabel), ivs[len(ivs)-1].To.UTC().Format(timeLabel)
	reasons := map[string]bool{}
	for _, iv := range ivs {
		for reason, v := range iv.Refusals {
			if v > 0 {
				reasons[reason] = true
			}
		}
	}
	for reason := range reasons {
		data.Reasons = append(data.Reasons, reason)
	}
	slices.Sort(data.Reasons)

	values := func(f func(interval) float64) []float64 {
		out := make([]float64, len(ivs))
		for i, iv := range ivs {
			out[i] = f(iv)
		}
		return out
	}
	perSecond := func(rpc string) func(interval) float64 {
		return func(iv interval) float64 { return iv.RPCs[rpc].PerSecond }
	}
	ms := func(rpc string, q func(latency) float64) func(interval) float64 {
		return func(iv interval) float64 {
			l, ok := iv.RPCs[rpc]
			if !ok || l.Calls == 0 {
				return math.NaN()
			}
			return 1000 * q(l)
		}
	}
	p50 := func(l latency) float64 { return l.P50 }
	p99 := func(l latency) float64 { return l.P99 }
	total := func(iv interval) float64 {
		var sum float64
		for _, v := range iv.Refusals {
			sum += v
		}
		return sum
	}

	calls := []namedValues{}
	for _, rpc := range chartedRPCs {
		calls = append(calls, namedValues{rpc, values(perSecond(rpc))})
	}
	data.Charts = append(data.Charts, chartOf(ivs, "chart-calls", "Calls per second", "/s", calls))
	for _, rpc := range chartedRPCs {
		data.Charts = append(data.Charts, chartOf(ivs, "chart-"+strings.ToLower(rpc), rpc+" latency, milliseconds", " ms",
			[]namedValues{{"p50", values(ms(rpc, p50))}, {"p99", values(ms(rpc, p99))}}))
	}
	refusals := []namedValues{}
	for _, reason := range data.Reasons {
		refusals = append(refusals, namedValues{reason, values(func(iv interval) float64 { return iv.Refusals[reason] })})
	}
	if len(refusals) == 0 {
		refusals = []namedValues{{"all reasons", values(total)}}
	}
	data.Charts = append(data.Charts, chartOf(ivs, "chart-refusals", "Refusals per second", "/s", refusals))

	data.Header = []string{"Interval ending (UTC)"}
	for _, rpc := range chartedRPCs {
		data.Header = append(data.Header, rpc+" calls/s", rpc+" p50", rpc+" p99")
	}
	data.Header = append(data.Header, "Refusals/s")
	for _, reason := range data.Reasons {
		data.Header = append(data.Header, reason+" /s")
	}
	for i := len(ivs) - 1; i >= 0; i-- {
		iv := ivs[i]
		row := []string{iv.To.UTC().Format(timeLabel)}
		for _, rpc := range chartedRPCs {
			row = append(row, number(iv.RPCs[rpc].PerSecond), duration(ms(rpc, p50)(iv)), duration(ms(rpc, p99)(iv)))
		}
		row = append(row, number(total(iv)))
		for _, reason := range data.Reasons {
			row = append(row, number(iv.Refusals[reason]))
		}
		data.Rows = append(data.Rows, row)
	}
	data.Stages = stageRows(ivs)
	return data
}

// stageRows is each Begin and Finish stage's latency over the intervals
// kept, from their summed bucket deltas.
func stageRows(ivs []interval) []stageRow {
	sums := map[string]hist{}
	for _, iv := range ivs {
		for name, d := range iv.stages {
			sums[name] = sumHist(sums[name], d)
		}
	}
	var rows []stageRow
	for _, rpc := range chartedRPCs {
		for _, stage := range stageOrder {
			h := sums[rpc+" "+stage]
			if h.count == 0 {
				continue
			}
			rows = append(rows, stageRow{RPC: rpc, Stage: stage, Calls: h.count,
				P50: duration(1000 * quantile(0.5, h)), P99: duration(1000 * quantile(0.99, h))})
		}
	}
	return rows
}

type namedValues struct {
	name   string
	values []float64
}

// chartOf draws series over the intervals: x is each interval's end, y
// from 0 to the largest value; a NaN (no calls to measure) breaks the
// line.
func chartOf(ivs []interval, id, title, unit string, all []namedValues) chart {
	from, to := ivs[0].From, ivs[len(ivs)-1].To
	top := 0.0
	for _, s := range all {
		for _, v := range s.values {
			if !math.IsNaN(v) {
				top = max(top, v)
			}
		}
	}
	ch := chart{ID: id, Title: title, XFrom: from.UTC().Format(timeLabel), XTo: to.UTC().Format(timeLabel), Empty: top == 0}
	if top == 0 {
		top = 1 // a flat line along the bottom, labelled 0 only
	} else {
		ch.YMax = number(top) + unit
	}
	span := to.Sub(from).Seconds()
	x := func(t time.Time) float64 { return plotLeft + (plotRight-plotLeft)*t.Sub(from).Seconds()/span }
	y := func(v float64) float64 { return plotBottom - (plotBottom-plotTop)*v/top }
	for i, s := range all {
		sr := series{Name: s.name, Class: fmt.Sprintf("s%d", i%seriesClasses+1), Last: number(s.values[len(s.values)-1])}
		var run []point
		flush := func() {
			switch len(run) {
			case 0:
			case 1:
				sr.Dots = append(sr.Dots, run[0])
			default:
				var b strings.Builder
				for j, p := range run {
					if j > 0 {
						b.WriteByte(' ')
					}
					b.WriteString(p.X + "," + p.Y)
				}
				sr.Lines = append(sr.Lines, b.String())
			}
			run = run[:0]
		}
		for j, v := range s.values {
			if math.IsNaN(v) {
				flush()
				continue
			}
			run = append(run, point{X: fmt.Sprintf("%.1f", x(ivs[j].To)), Y: fmt.Sprintf("%.1f", y(v))})
		}
		flush()
		ch.Series = append(ch.Series, sr)
	}
	return ch
}

// number prints a rate or a latency to about three significant digits;
// "-" for NaN (no calls to measure).
func number(v float64) string {
	switch {
	case math.IsNaN(v):
		return noValue
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 0.01:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// duration prints milliseconds, "-" for NaN.
func duration(ms float64) string {
	if math.IsNaN(ms) {
		return noValue
	}
	return number(ms) + " ms"
}
