package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// rowID names a row of the load test; the names are what -rows matches.
type rowID string

// The rows, in the order a round runs them.
const (
	rowUngated  rowID = "ungated c=1"
	rowPG1      rowID = "gated pg c=1"
	rowPG16     rowID = "gated pg c=16"
	rowPG64     rowID = "gated pg c=64"
	rowSQLite1  rowID = "gated sqlite c=1"
	rowSQLite64 rowID = "gated sqlite c=64"
	rowReplay   rowID = "replay pg c=1"
	// rowReplayCached replays through a second payments server, with the
	// replay cache on, on the same Dedupe service.
	rowReplayCached rowID = "replay cached pg c=1"
	rowFloor1       rowID = "floor pair c=1"
	rowFloor64      rowID = "floor pair c=64"
)

// allRows is every row in run order.
var allRows = []rowID{rowUngated, rowPG1, rowPG16, rowPG64, rowSQLite1, rowSQLite64, rowReplay, rowReplayCached, rowFloor1, rowFloor64}

// sample is one row's result in one round.
type sample struct {
	// P50 and P99 are latency percentiles of the successful calls.
	P50, P99 time.Duration
	// RPS is calls (pgbench: script runs, one floor pair each) per second.
	RPS float64
	// Count is how many calls completed, Errors how many of them failed.
	Count, Errors int64
}

// loadAvg is the 1, 5 and 15 minute load averages, as uptime prints them.
type loadAvg [3]float64

// String formats the load as uptime does.
func (l loadAvg) String() string { return fmt.Sprintf("%.2f, %.2f, %.2f", l[0], l[1], l[2]) }

// parseLoadAvg reads the first three fields of /proc/loadavg.
func parseLoadAvg(s string) (loadAvg, error) {
	var l loadAvg
	if _, err := fmt.Sscanf(s, "%f %f %f", &l[0], &l[1], &l[2]); err != nil {
		return loadAvg{}, fmt.Errorf("load average %q: %w", s, err)
	}
	return l, nil
}

// round is every row's sample in one round, with the load before and after.
type round struct {
	Samples     map[rowID]sample
	Start, Stop loadAvg
}

// percentile returns the p-th percentile (0 < p ≤ 100) of sorted by the
// nearest-rank method; 0 for no values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// median returns the median of vs (the mean of the middle two for an even
// count); NaN for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medians returns, per row, the median across rounds of each field of its
// samples; rows absent from every round are absent.
func medians(rounds []round) map[rowID]sample {
	out := map[rowID]sample{}
	for _, id := range allRows {
		var p50, p99, rps []float64
		var count, errs int64
		for _, r := range rounds {
			s, ok := r.Samples[id]
			if !ok {
				continue
			}
			p50 = append(p50, float64(s.P50))
			p99 = append(p99, float64(s.P99))
			rps = append(rps, s.RPS)
			count += s.Count
			errs += s.Errors
		}
		if len(p50) == 0 {
			continue
		}
		out[id] = sample{P50: time.Duration(median(p50)), P99: time.Duration(median(p99)), RPS: median(rps), Count: count, Errors: errs}
	}
	return out
}

// goal is one line of issue 12's ratio table.
type goal struct {
	// Name is the line as the issue words it.
	Name string
	// Limit is the goal; AtMost says the value must not exceed it, else it
	// must not fall below it.
	Limit  float64
	AtMost bool
	// value computes the line from one set of samples; false when a row it
	// needs is missing.
	value func(map[rowID]sample) (float64, bool)
}

// goals are issue 12's ratio table, in its order, with the replay line
// twice: through the Dedupe service and from the replay cache.
var goals = []goal{
	{Name: "gated p50 / (ungated p50 + floor pair p50), 1 caller", Limit: 1.2, AtMost: true, value: func(m map[rowID]sample) (float64, bool) {
		g, ok1 := m[rowPG1]
		u, ok2 := m[rowUngated]
		f, ok3 := m[rowFloor1]
		return float64(g.P50) / float64(u.P50+f.P50), ok1 && ok2 && ok3 && u.P50+f.P50 > 0
	}},
	{Name: "gated req/s / pgbench pair tps, 64 callers", Limit: 1.0, value: func(m map[rowID]sample) (float64, bool) {
		g, ok1 := m[rowPG64]
		f, ok2 := m[rowFloor64]
		return g.RPS / f.RPS, ok1 && ok2 && f.RPS > 0
	}},
	{Name: "replay p50 / ungated p50, 1 caller", Limit: 1.5, AtMost: true, value: func(m map[rowID]sample) (float64, bool) {
		r, ok1 := m[rowReplay]
		u, ok2 := m[rowUngated]
		return float64(r.P50) / float64(u.P50), ok1 && ok2 && u.P50 > 0
	}},
	{Name: "cached replay p50 / ungated p50, 1 caller", Limit: 1.5, AtMost: true, value: func(m map[rowID]sample) (float64, bool) {
		r, ok1 := m[rowReplayCached]
		u, ok2 := m[rowUngated]
		return float64(r.P50) / float64(u.P50), ok1 && ok2 && u.P50 > 0
	}},
	{Name: "gated throughput at 64 callers vs 16 callers", Limit: 1, value: func(m map[rowID]sample) (float64, bool) {
		a, ok1 := m[rowPG64]
		b, ok2 := m[rowPG16]
		return a.RPS / b.RPS, ok1 && ok2 && b.RPS > 0
	}},
	{Name: "embedded store, reservations/s at 64 callers", Limit: 3000, value: func(m map[rowID]sample) (float64, bool) {
		s, ok := m[rowSQLite64]
		return s.RPS, ok
	}},
}

// outcome is a goal evaluated on the medians and on each round.
type outcome struct {
	goal
	// Value is the goal's value on the rows' medians across rounds; OK
	// false when a row it needs did not run.
	Value float64
	OK    bool
	// Min and Max are the smallest and largest value of the goal computed
	// within one round.
	Min, Max float64
}

// Met reports whether Value meets the goal.
func (o outcome) Met() bool {
	if !o.OK {
		return false
	}
	if o.AtMost {
		return o.Value <= o.Limit
	}
	return o.Value >= o.Limit
}

// evaluate computes every goal on the medians and on each round alone.
func evaluate(rounds []round, med map[rowID]sample) []outcome {
	out := make([]outcome, 0, len(goals))
	for _, g := range goals {
		o := outcome{goal: g, Min: math.Inf(1), Max: math.Inf(-1)}
		o.Value, o.OK = g.value(med)
		for _, r := range rounds {
			if v, ok := g.value(r.Samples); ok {
				o.Min, o.Max = math.Min(o.Min, v), math.Max(o.Max, v)
			}
		}
		out = append(out, o)
	}
	return out
}

// formatDuration prints a latency with three significant figures.
func formatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.2fµs", float64(d)/float64(time.Microsecond))
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
}

// formatValue prints a goal's value: a ratio to two decimals, a rate whole.
func formatValue(g goal, v float64) string {
	if g.Limit >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// formatGoal prints a goal's limit as issue 12 does.
func formatGoal(g goal) string {
	op := "≥"
	if g.AtMost {
		op = "≤"
	}
	if g.Limit >= 1000 {
		return fmt.Sprintf("%s %s", op, groupThousands(int64(g.Limit)))
	}
	return fmt.Sprintf("%s %g", op, g.Limit)
}

// groupThousands prints n with commas between groups of three digits.
func groupThousands(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && c != '-' && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// writeReport prints the ratio table, the rows' medians and the load per
// round, as Markdown tables.
func writeReport(w io.Writer, rounds []round, settings string) {
	med := medians(rounds)
	fmt.Fprintf(w, "%s\n\n", settings)
	fmt.Fprintln(w, "| ratio (medians across rounds) | goal | value | per round | met |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- |")
	for _, o := range evaluate(rounds, med) {
		if !o.OK {
			fmt.Fprintf(w, "| %s | %s | n/a | n/a | n/a |\n", o.Name, formatGoal(o.goal))
			continue
		}
		met := "no"
		if o.Met() {
			met = "yes"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s to %s | %s |\n", o.Name, formatGoal(o.goal), formatValue(o.goal, o.Value),
			formatValue(o.goal, o.Min), formatValue(o.goal, o.Max), met)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| row (medians across rounds) | p50 | p99 | req/s | calls (all rounds) | errors (all rounds) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	for _, id := range allRows {
		s, ok := med[id]
		if !ok {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %d | %d |\n", id, formatDuration(s.P50), formatDuration(s.P99), s.RPS, s.Count, s.Errors)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| round | load average at start | load average at end |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	for i, r := range rounds {
		fmt.Fprintf(w, "| %d | %s | %s |\n", i+1, r.Start, r.Stop)
	}
}
