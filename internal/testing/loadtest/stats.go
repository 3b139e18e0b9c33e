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
	rowUngated rowID = "ungated c=1"
	rowPG1     rowID = "gated pg c=1"
	rowPG16    rowID = "gated pg c=16"
	rowPG64    rowID = "gated pg c=64"
	// The no-group-commit rows call a payments server on a Dedupe service
	// of their own whose store commits every statement alone
	// (-store-max-batch=1), on a database of its own on the same server:
	// PostgreSQL's cost per call without group commit, and the store as it
	// runs on Citus, which turns group commit off.
	rowNoGC16 rowID = "gated pg no-group-commit c=16"
	rowNoGC64 rowID = "gated pg no-group-commit c=64"
	// The no-quota rows call a payments server on a Dedupe service of their
	// own with the quotas off (-caller-max-records=0 -caller-max-bytes=0),
	// on the pg rows' database: what the quotas cost beside the gated pg
	// rows, which keep them on.
	rowPGNoQuota16 rowID = "gated pg no-quota c=16"
	rowPGNoQuota64 rowID = "gated pg no-quota c=64"
	// The Citus rows call a payments server on a Dedupe service on the
	// coordinator of a Citus cluster of two workers (-stores citus).
	rowCitus1  rowID = "gated citus c=1"
	rowCitus16 rowID = "gated citus c=16"
	rowCitus64 rowID = "gated citus c=64"
	// The Citus no-quota rows call a second payments server and Dedupe
	// service on the same coordinator, with the per-caller quotas off
	// (-caller-max-records=0, -caller-max-bytes=0), so no Begin reads the
	// caller's usage: on Citus that read is a query on every shard of
	// idemgate_usage_changes, which is distributed by key, not namespace.
	rowCitusNoQuota16 rowID = "gated citus no-quota c=16"
	rowCitusNoQuota64 rowID = "gated citus no-quota c=64"
	// The idle rows make no call for the row's duration: the CPU the
	// servers spend on their own (the sweeper, the usage compaction, the
	// metrics' reads, the listeners' probes, autovacuum, Citus's
	// maintenance), which the per-call figures include and a slow row
	// divides by few calls.
	rowIdlePG    rowID = "idle pg (no calls)"
	rowIdleCitus rowID = "idle citus (no calls)"
	// The after-reply rows call a second payments server on the PostgreSQL
	// Dedupe service, whose ChargeCard answers before its outcome is stored
	// (-finish-after-reply: FINISH_POLICY_AFTER_REPLY).
	rowAfterReply1  rowID = "gated pg after-reply c=1"
	rowAfterReply16 rowID = "gated pg after-reply c=16"
	rowAfterReply64 rowID = "gated pg after-reply c=64"
	// The in-process rows call a payments server that runs the Dedupe
	// service itself (-dedupe in-process), on the PostgreSQL database.
	rowInProcess1  rowID = "gated pg in-process c=1"
	rowInProcess64 rowID = "gated pg in-process c=64"
	rowSQLite1     rowID = "gated sqlite c=1"
	rowSQLite64    rowID = "gated sqlite c=64"
	// rowSQLiteInProcess64 calls a payments server that runs the Dedupe
	// service itself on the embedded store: one tool server with its own
	// store, the embedded store's natural deployment.
	rowSQLiteInProcess64 rowID = "gated sqlite in-process c=64"
	rowReplay            rowID = "replay pg c=1"
	// rowReplayCached replays through a payments server with the replay
	// cache on, on the same Dedupe service.
	rowReplayCached rowID = "replay cached pg c=1"
	rowFloor1       rowID = "floor pair c=1"
	rowFloor16      rowID = "floor pair c=16"
	rowFloor64      rowID = "floor pair c=64"
	// The batched floor rows commit as group commit does: 2 pgbench
	// clients (the store's 2 writers), each transaction carrying half the
	// callers' reserves, then another their Finishes (floorScript.batched).
	rowFloorBatched16 rowID = "floor batched c=16 (2 conns x 8 pairs a commit)"
	rowFloorBatched64 rowID = "floor batched c=64 (2 conns x 32 pairs a commit)"
)

// batchedWriters is the batched floor's pgbench clients: the store's group
// commit writers (pgstore.DefaultGroupCommit.Writers).
const batchedWriters = 2

// allRows is every row in run order.
var allRows = []rowID{
	rowUngated, rowPG1, rowPG16, rowPG64, rowAfterReply1, rowAfterReply16, rowAfterReply64, rowInProcess1, rowInProcess64,
	rowSQLite1, rowSQLite64, rowSQLiteInProcess64, rowReplay, rowReplayCached, rowFloor1, rowFloor16, rowFloor64,
	rowFloorBatched16, rowFloorBatched64, rowNoGC16, rowNoGC64, rowPGNoQuota16, rowPGNoQuota64, rowCitus1, rowCitus16, rowCitus64,
	rowCitusNoQuota16, rowCitusNoQuota64, rowIdlePG, rowIdleCitus,
}

// citusRows are the rows that need -stores citus.
var citusRows = []rowID{rowCitus1, rowCitus16, rowCitus64, rowCitusNoQuota16, rowCitusNoQuota64, rowIdleCitus}

// sample is one row's result in one round.
type sample struct {
	// P50 and P99 are latency percentiles of the successful calls.
	P50, P99 time.Duration
	// RPS is calls (pgbench: script runs, one floor pair each) per second.
	RPS float64
	// Count is how many calls completed, Errors how many of them failed.
	Count, Errors int64
	// ServiceReplays is how many replays the Dedupe service served while
	// the row ran (idemgate_dedupe_replays_total, read before and after),
	// read only for the replay rows: ReplaysRead says it was.
	ServiceReplays int64
	ReplaysRead    bool
	// Budget is each stage's mean time over the row (the stage histograms
	// of the payments server and its Dedupe service, read before and
	// after); only for the rows the budget is read on (gated pg c=1,
	// replay pg c=1).
	Budget map[stageKey]time.Duration
	// CPU is the CPU time each process used during the row (/proc), the
	// load generator's from its exit status.
	CPU map[cpuRole]time.Duration
	// Xids and WAL are the transaction ids handed out (one per writing
	// transaction) and the WAL bytes written during the row, summed over
	// the row's servers; CountsRead says they were read.
	Xids, WAL  int64
	CountsRead bool
	// Elapsed is the time between the row's two reads of the CPU.
	Elapsed time.Duration
}

// perCall is the sample's value per successful call; false when none.
func (s sample) perCall(v int64) (float64, bool) {
	ok := s.Count - s.Errors
	if ok <= 0 {
		return 0, false
	}
	return float64(v) / float64(ok), true
}

// budgetBetween is each stage's mean between two reads of the stage
// histograms. A stage observed for fewer than one in a hundred of the tool
// server's Begins in between is left out: it is not what the row measures
// (the one fresh call that starts a replay row), and its mean is noise.
func budgetBetween(before, after map[stageKey]stageSum) map[stageKey]time.Duration {
	begin := stageKey{"tool", "", "begin"}
	var begins uint64
	if a, b := after[begin], before[begin]; a.count > b.count {
		begins = a.count - b.count
	}
	out := map[stageKey]time.Duration{}
	for k, a := range after {
		b := before[k]
		// A server that restarted during the row counts from zero again:
		// its stage is left out, not read as an underflow.
		if a.count <= b.count || a.sum < b.sum {
			continue
		}
		if n := a.count - b.count; n*100 >= begins {
			out[k] = time.Duration((a.sum - b.sum) / float64(n) * float64(time.Second))
		}
	}
	return out
}

// hitRatio is the share of the sample's successful calls answered without
// the Dedupe service serving a replay: from the replay cache, on a row whose
// every call is a replay. False when the service's count was not read or no
// call succeeded.
func (s sample) hitRatio() (float64, bool) {
	ok := s.Count - s.Errors
	if !s.ReplaysRead || ok <= 0 {
		return 0, false
	}
	return max(0, 1-float64(s.ServiceReplays)/float64(ok)), true
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
		var sum sample
		for _, r := range rounds {
			s, ok := r.Samples[id]
			if !ok {
				continue
			}
			p50 = append(p50, float64(s.P50))
			p99 = append(p99, float64(s.P99))
			rps = append(rps, s.RPS)
			sum.Count += s.Count
			sum.Errors += s.Errors
			sum.ServiceReplays += s.ServiceReplays
			sum.ReplaysRead = sum.ReplaysRead || s.ReplaysRead
		}
		if len(p50) == 0 {
			continue
		}
		sum.P50, sum.P99, sum.RPS = time.Duration(median(p50)), time.Duration(median(p99)), median(rps)
		out[id] = sum
	}
	return out
}

// goal is one line of issue 19's ratio table.
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

// latencyOver is the p50 of row num over the sum of the p50s of the rows
// den, each weighted: false unless every row ran and the sum is positive.
func latencyOver(m map[rowID]sample, num rowID, den map[rowID]float64) (float64, bool) {
	n, ok := m[num]
	if !ok {
		return 0, false
	}
	var d float64
	for id, w := range den {
		s, ok := m[id]
		if !ok {
			return 0, false
		}
		d += w * float64(s.P50)
	}
	return float64(n.P50) / d, d > 0
}

// best is the highest req/s of the rows ids: false unless every one ran.
func best(m map[rowID]sample, ids ...rowID) (float64, bool) {
	var b float64
	for _, id := range ids {
		s, ok := m[id]
		if !ok {
			return 0, false
		}
		b = max(b, s.RPS)
	}
	return b, true
}

// throughputOver is the best req/s of the rows num over the best of the
// rows den: false unless all of them ran and the denominator is positive.
func throughputOver(m map[rowID]sample, num, den []rowID) (float64, bool) {
	n, ok1 := best(m, num...)
	d, ok2 := best(m, den...)
	return n / d, ok1 && ok2 && d > 0
}

// floorRows are the floor pair at every concurrency it runs, for its peak:
// 64 backends on 2 cores run it slower than 16 do.
var floorRows = []rowID{rowFloor1, rowFloor16, rowFloor64}

// goals are issue 19's ratio table, in its order; the peak line is also
// given for the after-reply and in-process servers, with the same goal,
// and the replay line twice: through the Dedupe service and from the
// replay cache.
var goals = []goal{
	{Name: "gated p50 / (ungated p50 + floor pair p50), 1 caller", Limit: 1.5, AtMost: true, value: func(m map[rowID]sample) (float64, bool) {
		return latencyOver(m, rowPG1, map[rowID]float64{rowUngated: 1, rowFloor1: 1})
	}},
	{Name: "after-reply p50 / (ungated p50 + floor pair p50 / 2), 1 caller: one commit, half the floor pair, on the caller's path",
		Limit: 1.2, AtMost: true, value: func(m map[rowID]sample) (float64, bool) {
			return latencyOver(m, rowAfterReply1, map[rowID]float64{rowUngated: 1, rowFloor1: 0.5})
		}},
	{Name: "gated req/s / floor pair tps, 16 callers", Limit: 1.0, value: func(m map[rowID]sample) (float64, bool) {
		return throughputOver(m, []rowID{rowPG16}, []rowID{rowFloor16})
	}},
	{Name: "gated req/s / floor pair tps, 64 callers", Limit: 1.0, value: func(m map[rowID]sample) (float64, bool) {
		return throughputOver(m, []rowID{rowPG64}, []rowID{rowFloor64})
	}},
	{Name: "gated req/s / batched floor pairs/s, 16 callers (the floor committing as group commit does)", Limit: 1.0, value: func(m map[rowID]sample) (float64, bool) {
		return throughputOver(m, []rowID{rowPG16}, []rowID{rowFloorBatched16})
	}},
	{Name: "gated req/s / batched floor pairs/s, 64 callers (the floor committing as group commit does)", Limit: 1.0, value: func(m map[rowID]sample) (float64, bool) {
		return throughputOver(m, []rowID{rowPG64}, []rowID{rowFloorBatched64})
	}},
	{Name: "gated best req/s / floor pair best tps, each over 1, 16 and 64 callers", Limit: 1.0, value: func(m map[rowID]sample) (float64, bool) {
		return throughputOver(m, []rowID{rowPG1, rowPG16, rowPG64}, floorRows)
	}},
	{Name: "after-reply best req/s (1, 16, 64 callers) / floor pair best tps", Limit: 1.0, value: func(m map[rowID]sample) (float64, bool) {
		return throughputOver(m, []rowID{rowAfterReply1, rowAfterReply16, rowAfterReply64}, floorRows)
	}},
	{Name: "in-process best req/s (1, 64 callers) / floor pair best tps", Limit: 1.0, value: func(m map[rowID]sample) (float64, bool) {
		return throughputOver(m, []rowID{rowInProcess1, rowInProcess64}, floorRows)
	}},
	{Name: "replay p50 / ungated p50, through the service, 1 caller", Limit: 2.0, AtMost: true, value: func(m map[rowID]sample) (float64, bool) {
		return latencyOver(m, rowReplay, map[rowID]float64{rowUngated: 1})
	}},
	{Name: "cached replay p50 / ungated p50, 1 caller", Limit: 1.5, AtMost: true, value: func(m map[rowID]sample) (float64, bool) {
		return latencyOver(m, rowReplayCached, map[rowID]float64{rowUngated: 1})
	}},
	{Name: "embedded store end to end, req/s at 64 callers", Limit: 3000, value: func(m map[rowID]sample) (float64, bool) {
		s, ok := m[rowSQLite64]
		return s.RPS, ok
	}},
	{Name: "embedded store in-process end to end, req/s at 64 callers", Limit: 3000, value: func(m map[rowID]sample) (float64, bool) {
		s, ok := m[rowSQLiteInProcess64]
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

// formatGoal prints a goal's limit as issue 19 does.
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

// formatHits prints a sample's replay cache hit ratio with the replays
// the Dedupe service served; "-" for a row that does not read them.
func formatHits(s sample) string {
	r, ok := s.hitRatio()
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.3f (%d of %d calls replayed by the service)", r, s.ServiceReplays, s.Count-s.Errors)
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
	fmt.Fprintln(w, "| row (medians across rounds) | p50 | p99 | req/s | calls (all rounds) | errors (all rounds) | replay cache hits (all rounds, from metrics) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, id := range allRows {
		s, ok := med[id]
		if !ok {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %d | %d | %s |\n", id, formatDuration(s.P50), formatDuration(s.P99), s.RPS, s.Count, s.Errors, formatHits(s))
	}
	writeBudget(w, rounds, rowPG1)
	writeBudget(w, rounds, rowReplay)
	writeCPU(w, rounds)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| round | load average at start | load average at end |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	for i, r := range rounds {
		fmt.Fprintf(w, "| %d | %s | %s |\n", i+1, r.Start, r.Stop)
	}
}

// budgetLines are the latency budget's lines in the order a call meets them:
// the tool server's stages, and inside its begin and finish the service's.
var budgetLines = []struct {
	key  stageKey
	name string
}{
	{stageKey{"tool", "", "prepare"}, "tool server: key, scope, fingerprint (prepare)"},
	{stageKey{"tool", "", "begin"}, "tool server: Begin round trip (begin)"},
	{stageKey{"service", "Begin", "checks"}, "  service Begin: checks and rate"},
	{stageKey{"service", "Begin", "queue"}, "  service Begin: waiting for a group-commit writer"},
	{stageKey{"service", "Begin", "statement"}, "  service Begin: statement, round trip and commit"},
	{stageKey{"service", "Begin", "store"}, "  service Begin: rest of the store"},
	{stageKey{"service", "Begin", "reply"}, "  service Begin: reply"},
	{stageKey{"tool", "", "handler"}, "tool server: handler"},
	{stageKey{"tool", "", "finish"}, "tool server: Finish round trip (finish)"},
	{stageKey{"service", "Finish", "checks"}, "  service Finish: checks"},
	{stageKey{"service", "Finish", "queue"}, "  service Finish: waiting for a group-commit writer"},
	{stageKey{"service", "Finish", "statement"}, "  service Finish: statement, round trip and commit"},
	{stageKey{"service", "Finish", "store"}, "  service Finish: rest of the store"},
	{stageKey{"service", "Finish", "reply"}, "  service Finish: reply"},
}

// writeBudget writes the latency budget of one caller on row (gated pg c=1,
// replay pg c=1): each
// stage's mean, the median over rounds, and what the stages leave out: the
// two hops to the service (the tool server's round trip less the service's
// stages) and everything outside the gate (the call's p50 less the tool
// server's stages, which mixes a median with means: a rough figure).
func writeBudget(w io.Writer, rounds []round, row rowID) {
	per := map[stageKey][]float64{}
	var p50 []float64
	for _, r := range rounds {
		s, ok := r.Samples[row]
		if !ok || s.Budget == nil {
			continue
		}
		p50 = append(p50, float64(s.P50))
		for k, d := range s.Budget {
			per[k] = append(per[k], float64(d))
		}
	}
	if len(p50) == 0 {
		return
	}
	mean := func(k stageKey) time.Duration {
		if v, ok := per[k]; ok {
			return time.Duration(median(v))
		}
		return 0
	}
	sumOf := func(side, rpc string) time.Duration {
		var d time.Duration
		for _, l := range budgetLines {
			if l.key.side == side && l.key.rpc == rpc {
				d += mean(l.key)
			}
		}
		return d
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| latency budget, %s (stage means from the stage histograms, median over rounds) | time |\n", row)
	fmt.Fprintln(w, "| --- | ---: |")
	for _, l := range budgetLines {
		if _, ok := per[l.key]; ok {
			fmt.Fprintf(w, "| %s | %s |\n", l.name, formatDuration(mean(l.key)))
		}
	}
	tool := sumOf("tool", "")
	fmt.Fprintf(w, "| the two hops of Begin (tool server's round trip less the service's stages) | %s |\n",
		formatDuration(mean(stageKey{"tool", "", "begin"})-sumOf("service", "Begin")))
	if _, ok := per[stageKey{"tool", "", "finish"}]; ok {
		fmt.Fprintf(w, "| the two hops of Finish (tool server's round trip less the service's stages) | %s |\n",
			formatDuration(mean(stageKey{"tool", "", "finish"})-sumOf("service", "Finish")))
	}
	fmt.Fprintf(w, "| outside the gate: caller to tool server and back, gRPC, the replies (p50 %s less the tool server's stages) | %s |\n",
		formatDuration(time.Duration(median(p50))), formatDuration(time.Duration(median(p50))-tool))
}

// cpuPerThousand is, per role, the median across rounds of the row's CPU
// seconds per 1,000 successful calls; and of its writing transactions and
// WAL bytes per call.
func cpuPerThousand(rounds []round, id rowID) (cpu map[cpuRole]float64, xids, wal float64, countsOK, ran bool) {
	per := map[cpuRole][]float64{}
	var xs, ws []float64
	for _, r := range rounds {
		s, ok := r.Samples[id]
		if !ok {
			continue
		}
		ran = true
		for role, d := range s.CPU {
			if v, ok := perThousand(d, s.Count-s.Errors); ok {
				per[role] = append(per[role], v)
			}
		}
		if s.CountsRead {
			if x, ok := s.perCall(s.Xids); ok {
				xs = append(xs, x)
			}
			if v, ok := s.perCall(s.WAL); ok {
				ws = append(ws, v)
			}
		}
	}
	cpu = map[cpuRole]float64{}
	for role, vs := range per {
		cpu[role] = median(vs)
	}
	if len(xs) > 0 {
		xids, wal, countsOK = median(xs), median(ws), true
	}
	return cpu, xids, wal, countsOK, ran
}

// serverRoles are the roles whose CPU is the database's.
var serverRoles = []cpuRole{rolePG, roleCoord, roleWorker1, roleWorker2}

// writeCPU prints the CPU each process spent per 1,000 calls of every row
// that read it, the database's writing transactions and WAL per call, and
// the capacity of one primary those give.
func writeCPU(w io.Writer, rounds []round) {
	fmt.Fprintln(w)
	fmt.Fprint(w, "| CPU-s per 1,000 calls (pgbench: pairs), medians across rounds | req/s |")
	for _, role := range cpuRoles {
		fmt.Fprintf(w, " %s |", role)
	}
	fmt.Fprintln(w, " all but the load generator | database write transactions per call | WAL bytes per call |")
	fmt.Fprint(w, "| --- | ---: |")
	for range cpuRoles {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w, " ---: | ---: | ---: |")
	med := medians(rounds)
	for _, id := range allRows {
		cpu, xids, wal, countsOK, ran := cpuPerThousand(rounds, id)
		if !ran || len(cpu) == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %.0f |", id, med[id].RPS)
		var servers float64
		for _, role := range cpuRoles {
			v, ok := cpu[role]
			if !ok {
				fmt.Fprint(w, " - |")
				continue
			}
			fmt.Fprintf(w, " %.3f |", v)
			if role != roleClient {
				servers += v
			}
		}
		fmt.Fprintf(w, " %.3f |", servers)
		if countsOK {
			fmt.Fprintf(w, " %.2f | %.0f |\n", xids, wal)
		} else {
			fmt.Fprintln(w, " - | - |")
		}
	}
	bg := map[rowID]map[cpuRole]float64{rowIdlePG: background(rounds, rowIdlePG), rowIdleCitus: background(rounds, rowIdleCitus)}
	for _, idle := range []rowID{rowIdlePG, rowIdleCitus} {
		if len(bg[idle]) == 0 {
			continue
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "| %s: CPU-s per second, medians across rounds | value |\n", idle)
		fmt.Fprintln(w, "| --- | ---: |")
		for _, role := range cpuRoles {
			if v, ok := bg[idle][role]; ok && role != roleClient {
				fmt.Fprintf(w, "| %s | %.4f |\n", role, v)
			}
		}
	}
	// One primary's capacity: a core gives 1,000 CPU-seconds per 1,000
	// seconds, so reservations per second per core = 1,000 / (the
	// database's CPU-s per 1,000 gated calls); net of the background, the
	// servers' CPU with no calls times the row's time, when an idle row ran.
	var lines []string
	for _, id := range []rowID{rowPG16, rowPG64, rowNoGC16, rowNoGC64, rowPGNoQuota16, rowPGNoQuota64, rowCitus16, rowCitus64, rowCitusNoQuota16, rowCitusNoQuota64} {
		cpu, _, _, _, ran := cpuPerThousand(rounds, id)
		if !ran {
			continue
		}
		var db float64
		for _, role := range serverRoles {
			db += cpu[role]
		}
		if db <= 0 {
			continue
		}
		idle := rowIdlePG
		if slices.Contains(citusRows, id) {
			idle = rowIdleCitus
		}
		net := "-"
		if n, ok := netPerThousand(rounds, id, bg[idle]); ok && n > 0 {
			net = fmt.Sprintf("%.3f | %.0f", n, 1000/n)
		} else {
			net = "- | -"
		}
		lines = append(lines, fmt.Sprintf("| %s | %.3f | %.0f | %s |", id, db, 1000/db, net))
	}
	if len(lines) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| capacity of the database's CPU (all its servers) | CPU-s per 1,000 gated calls | gated calls (Begin + Finish) per second per core | net of the background: CPU-s per 1,000 | net: per second per core |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
}

// background is, per role, the median across rounds of the CPU seconds
// per second the idle row id read; empty when it did not run.
func background(rounds []round, id rowID) map[cpuRole]float64 {
	per := map[cpuRole][]float64{}
	for _, r := range rounds {
		s, ok := r.Samples[id]
		if !ok || s.Elapsed <= 0 {
			continue
		}
		for role, d := range s.CPU {
			per[role] = append(per[role], d.Seconds()/s.Elapsed.Seconds())
		}
	}
	out := map[cpuRole]float64{}
	for role, vs := range per {
		out[role] = median(vs)
	}
	return out
}

// netPerThousand is the median across rounds of the database's CPU
// seconds per 1,000 calls of row id less its background (bg, CPU-s per
// second per role, times the row's time); false without a background or a
// round with calls.
func netPerThousand(rounds []round, id rowID, bg map[cpuRole]float64) (float64, bool) {
	if len(bg) == 0 {
		return 0, false
	}
	var vs []float64
	for _, r := range rounds {
		s, ok := r.Samples[id]
		if !ok || s.Elapsed <= 0 {
			continue
		}
		var used float64
		for _, role := range serverRoles {
			if d, ok := s.CPU[role]; ok {
				used += d.Seconds() - bg[role]*s.Elapsed.Seconds()
			}
		}
		if v, ok := perThousand(time.Duration(used*float64(time.Second)), s.Count-s.Errors); ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, false
	}
	return median(vs), true
}
