package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ghzReport is the part of ghz's JSON report (-O json) the load test reads.
type ghzReport struct {
	Count               int64            `json:"count"`
	Total               time.Duration    `json:"total"`
	RPS                 float64          `json:"rps"`
	StatusCodes         map[string]int64 `json:"statusCodeDistribution"`
	Errors              map[string]int64 `json:"errorDistribution"`
	LatencyDistribution []struct {
		Percentage int           `json:"percentage"`
		Latency    time.Duration `json:"latency"`
	} `json:"latencyDistribution"`
}

// parseGhz reads a ghz JSON report into a sample. Latencies are ghz's
// percentiles of the successful calls; every status but OK is an error.
func parseGhz(r io.Reader) (sample, ghzReport, error) {
	var rep ghzReport
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		return sample{}, rep, fmt.Errorf("ghz report: %w", err)
	}
	s := sample{RPS: rep.RPS, Count: rep.Count}
	for code, n := range rep.StatusCodes {
		if code != "OK" {
			s.Errors += n
		}
	}
	for _, l := range rep.LatencyDistribution {
		switch l.Percentage {
		case 50:
			s.P50 = l.Latency
		case 99:
			s.P99 = l.Latency
		}
	}
	if s.Count > s.Errors && (s.P50 == 0 || s.P99 == 0) {
		return sample{}, rep, fmt.Errorf("ghz report: no 50th or 99th percentile in %d calls", s.Count)
	}
	return s, rep, nil
}

// replaysMetric counts the replays a Dedupe service served, one series per
// method.
const replaysMetric = "idemgate_dedupe_replays_total"

// parseMetrics reads a Prometheus text exposition.
func parseMetrics(text string) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(strings.NewReader(text))
}

// parseReplays sums every idemgate_dedupe_replays_total series in a
// Prometheus text exposition: the replays served, whatever the method.
// The counter has no series before the first replay, so the exposition
// must show it is the Dedupe service's (idemgate_dedupe_outcomes_total,
// whose series always exist) for a missing counter to read as 0.
func parseReplays(text string) (float64, error) {
	families, err := parseMetrics(text)
	if err != nil {
		return 0, err
	}
	if families["idemgate_dedupe_outcomes_total"] == nil {
		return 0, errors.New("no idemgate_dedupe_outcomes_total: not a Dedupe service's metrics")
	}
	var sum float64
	for _, m := range families[replaysMetric].GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum, nil
}

// stageKey names one stage series: the side ("tool" or "service"), the
// RPC (Begin, Finish; "" on the tool side) and the stage.
type stageKey struct{ side, rpc, stage string }

// stageSum is a stage histogram's count and sum of seconds.
type stageSum struct {
	count uint64
	sum   float64
}

// Stage histograms read for the latency budget.
const (
	toolStagesMetric    = "idemgate_interceptor_stage_seconds"
	serviceStagesMetric = "idemgate_dedupe_stage_seconds"
)

// parseStages reads the stage histograms of a tool server's or a Dedupe
// service's exposition, summed over methods; an exposition with neither is
// an error.
func parseStages(text string) (map[stageKey]stageSum, error) {
	families, err := parseMetrics(text)
	if err != nil {
		return nil, err
	}
	out := map[stageKey]stageSum{}
	found := false
	for name, side := range map[string]string{toolStagesMetric: "tool", serviceStagesMetric: "service"} {
		f := families[name]
		if f == nil {
			continue
		}
		found = true
		for _, m := range f.GetMetric() {
			k := stageKey{side: side}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "rpc":
					k.rpc = l.GetValue()
				case "stage":
					k.stage = l.GetValue()
				}
			}
			s := out[k]
			s.count += m.GetHistogram().GetSampleCount()
			s.sum += m.GetHistogram().GetSampleSum()
			out[k] = s
		}
	}
	if !found {
		return nil, fmt.Errorf("neither %s nor %s in the exposition", toolStagesMetric, serviceStagesMetric)
	}
	return out, nil
}

// pgbenchSummary is what pgbench prints at the end of a run.
type pgbenchSummary struct {
	// TPS is script runs a second, without the initial connection time.
	TPS float64
	// Processed and Failed are the transactions (script runs) done and failed.
	Processed, Failed int64
}

var (
	pgbenchTPS       = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	pgbenchProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	pgbenchFailed    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
)

// parsePgbenchSummary reads pgbench's closing report.
func parsePgbenchSummary(out string) (pgbenchSummary, error) {
	var s pgbenchSummary
	m := pgbenchTPS.FindStringSubmatch(out)
	if m == nil {
		return s, fmt.Errorf("pgbench printed no tps line:\n%s", out)
	}
	s.TPS, _ = strconv.ParseFloat(m[1], 64)
	if m := pgbenchProcessed.FindStringSubmatch(out); m != nil {
		s.Processed, _ = strconv.ParseInt(m[1], 10, 64)
	} else {
		return s, fmt.Errorf("pgbench printed no count of processed transactions:\n%s", out)
	}
	if m := pgbenchFailed.FindStringSubmatch(out); m != nil { // PostgreSQL 15 on
		s.Failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return s, nil
}

// parsePgbenchLog reads a per-transaction log of pgbench --log
// ("client_id transaction_no time script_no time_epoch time_us ...", time
// in microseconds) and appends each transaction's latency to into. Failed
// transactions (time "failed" or "skipped") are left out.
func parsePgbenchLog(r io.Reader, into []time.Duration) ([]time.Duration, error) {
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			return into, fmt.Errorf("pgbench log line %d: %q: want 6 fields or more", line, sc.Text())
		}
		us, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			continue // "failed" or "skipped"
		}
		into = append(into, time.Duration(us)*time.Microsecond)
	}
	return into, sc.Err()
}

// pgbenchSample is a pgbench run's sample: its rate from the summary, its
// percentiles from the per-transaction latencies.
func pgbenchSample(sum pgbenchSummary, latencies []time.Duration) sample {
	slices.Sort(latencies)
	return sample{
		P50:    percentile(latencies, 50),
		P99:    percentile(latencies, 99),
		RPS:    sum.TPS,
		Count:  sum.Processed,
		Errors: sum.Failed,
	}
}
