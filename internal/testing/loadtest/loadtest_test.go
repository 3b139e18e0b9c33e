package main

import (
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, v := range n {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value", ms(7), 99, 7 * time.Millisecond},
		{"median of odd count", ms(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{"nearest rank rounds up", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(slices.Collect(func(yield func(int) bool) {
			for i := 1; i <= 100; i++ {
				yield(i)
			}
		})...), 99, 99 * time.Millisecond},
		{"p100 is the largest", ms(1, 2, 3), 100, 3 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.sorted, tc.p); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tc.sorted, tc.p, got, tc.want)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median of 3 1 2 = %v, want 2", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of 4 1 3 2 = %v, want 2.5", got)
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median of nothing = %v, want NaN", got)
	}
	in := []float64{3, 1, 2}
	median(in)
	if !slices.Equal(in, []float64{3, 1, 2}) {
		t.Errorf("median reordered its input: %v", in)
	}
}

func TestMediansTakeEachFieldAcrossRounds(t *testing.T) {
	rounds := []round{
		{Samples: map[rowID]sample{rowPG1: {P50: 3 * time.Millisecond, P99: 9 * time.Millisecond, RPS: 100, Count: 10}}},
		{Samples: map[rowID]sample{rowPG1: {P50: 1 * time.Millisecond, P99: 30 * time.Millisecond, RPS: 300, Count: 20, Errors: 1}}},
		{Samples: map[rowID]sample{rowPG1: {P50: 2 * time.Millisecond, P99: 10 * time.Millisecond, RPS: 200, Count: 30}}},
	}
	got := medians(rounds)
	want := sample{P50: 2 * time.Millisecond, P99: 10 * time.Millisecond, RPS: 200, Count: 60, Errors: 1}
	if !reflect.DeepEqual(got[rowPG1], want) {
		t.Errorf("medians = %+v, want %+v", got[rowPG1], want)
	}
	if _, ok := got[rowPG64]; ok {
		t.Error("a row that never ran has a median")
	}
}

// goalSamples are one round's medians, each chosen so that a ratio over
// the wrong row, or with the wrong weight, comes out different.
func goalSamples() map[rowID]sample {
	ms := time.Millisecond
	return map[rowID]sample{
		rowUngated:           {P50: ms / 5},
		rowFloor1:            {P50: ms, RPS: 900},
		rowFloor16:           {RPS: 2000},
		rowFloor64:           {RPS: 1600},
		rowFloorBatched16:    {RPS: 4000},
		rowFloorBatched64:    {RPS: 4800},
		rowPG1:               {P50: 3 * ms, RPS: 330},
		rowPG16:              {RPS: 1000},
		rowPG64:              {RPS: 1200},
		rowAfterReply1:       {P50: 840 * time.Microsecond, RPS: 1100},
		rowAfterReply16:      {RPS: 2100},
		rowAfterReply64:      {RPS: 2500},
		rowInProcess1:        {RPS: 500},
		rowInProcess64:       {RPS: 1800},
		rowReplay:            {P50: ms / 2},
		rowReplayCached:      {P50: ms / 4},
		rowSQLite64:          {RPS: 3100},
		rowSQLiteInProcess64: {RPS: 4200},
	}
}

func TestGoals(t *testing.T) {
	m := goalSamples()
	rounds := []round{{Samples: m}, {Samples: map[rowID]sample{rowSQLite64: {RPS: 2900}, rowSQLiteInProcess64: {RPS: 2800}}}}
	out := evaluate(rounds, m)
	want := []struct {
		value    float64
		met      bool
		min, max float64
	}{
		{2.5, false, 2.5, 2.5},    // 3ms / (0.2ms + 1ms)
		{1.2, true, 1.2, 1.2},     // 0.84ms / (0.2ms + 1ms/2): equal to an at-most goal meets it
		{0.5, false, 0.5, 0.5},    // 1000 / 2000, both at 16
		{0.75, false, 0.75, 0.75}, // 1200 / 1600, both at 64
		{0.25, false, 0.25, 0.25}, // 1000 / 4000, the batched floor at 16
		{0.25, false, 0.25, 0.25}, // 1200 / 4800, the batched floor at 64
		{0.6, false, 0.6, 0.6},    // gated's best, 1200 at 64, over the floor's, 2000 at 16
		{1.25, true, 1.25, 1.25},  // after-reply's best, 2500, over 2000
		{0.9, false, 0.9, 0.9},    // in-process's best, 1800, over 2000
		{2.5, false, 2.5, 2.5},    // 0.5ms / 0.2ms
		{1.25, true, 1.25, 1.25},  // 0.25ms / 0.2ms
		{3100, true, 2900, 3100},  // absolute, each round
		{4200, true, 2800, 4200},  // the embedded store in-process, absolute
	}
	if len(out) != len(want) {
		t.Fatalf("%d goals, want %d", len(out), len(want))
	}
	for i, w := range want {
		o := out[i]
		if !o.OK || math.Abs(o.Value-w.value) > 1e-9 || o.Met() != w.met || math.Abs(o.Min-w.min) > 1e-9 || math.Abs(o.Max-w.max) > 1e-9 {
			t.Errorf("%s: value %v (ok %v) met %v, per round %v to %v; want %v met %v, %v to %v",
				o.Name, o.Value, o.OK, o.Met(), o.Min, o.Max, w.value, w.met, w.min, w.max)
		}
	}
	if o := evaluate(nil, map[rowID]sample{rowPG1: {P50: time.Millisecond}})[0]; o.OK || o.Met() {
		t.Errorf("a goal whose rows did not run: ok %v, met %v", o.OK, o.Met())
	}

	// Without the floor at 16 callers: its own line and every peak line
	// are left out, the 64-caller line is not.
	no16 := goalSamples()
	delete(no16, rowFloor16)
	delete(no16, rowReplayCached)
	got := map[string]bool{}
	for _, o := range evaluate([]round{{Samples: no16}}, no16) {
		got[o.Name] = o.OK
	}
	for name, ok := range map[string]bool{
		"gated req/s / floor pair tps, 16 callers":                               false,
		"gated req/s / floor pair tps, 64 callers":                               true,
		"gated best req/s / floor pair best tps, each over 1, 16 and 64 callers": false,
		"after-reply best req/s (1, 16, 64 callers) / floor pair best tps":       false,
		"in-process best req/s (1, 64 callers) / floor pair best tps":            false,
		"cached replay p50 / ungated p50, 1 caller":                              false,
		"replay p50 / ungated p50, through the service, 1 caller":                true,
	} {
		if got[name] != ok {
			t.Errorf("%s without the floor at 16 and the cached replay: computed %v, want %v", name, got[name], ok)
		}
	}
	if len(got) != len(goals) {
		t.Errorf("%d goal names, want %d distinct ones", len(got), len(goals))
	}
}

func TestHitRatio(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    sample
		want float64
		ok   bool
	}{
		{"all from the cache", sample{Count: 100, ServiceReplays: 0, ReplaysRead: true}, 1, true},
		{"some misses", sample{Count: 1000, ServiceReplays: 4, ReplaysRead: true}, 0.996, true},
		{"failed calls are not calls answered", sample{Count: 110, Errors: 10, ServiceReplays: 20, ReplaysRead: true}, 0.8, true},
		{"no cache: every call a replay at the service", sample{Count: 50, ServiceReplays: 50, ReplaysRead: true}, 0, true},
		{"more replays than calls reads as none from the cache", sample{Count: 50, ServiceReplays: 60, ReplaysRead: true}, 0, true},
		{"not read", sample{Count: 100}, 0, false},
		{"no successful call", sample{Count: 3, Errors: 3, ReplaysRead: true}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.s.hitRatio()
			if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("hitRatio = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	rounds := []round{
		{Samples: map[rowID]sample{rowReplayCached: {P50: time.Millisecond, Count: 1000, ServiceReplays: 10, ReplaysRead: true}}},
		{Samples: map[rowID]sample{rowReplayCached: {P50: time.Millisecond, Count: 3000, ServiceReplays: 30, ReplaysRead: true}}},
	}
	med := medians(rounds)[rowReplayCached]
	if med.ServiceReplays != 40 || med.Count != 4000 || !med.ReplaysRead {
		t.Errorf("medians of the cached row: %+v, want its replays and calls summed across rounds", med)
	}
	if got := formatHits(med); got != "0.990 (40 of 4000 calls replayed by the service)" {
		t.Errorf("formatHits = %q", got)
	}
	if got := formatHits(sample{Count: 5}); got != "-" {
		t.Errorf("formatHits of a row that reads no replays = %q, want -", got)
	}
}

func TestWriteReport(t *testing.T) {
	m := goalSamples()
	delete(m, rowInProcess1) // its peak line is left out
	m[rowReplayCached] = sample{P50: time.Millisecond / 4, P99: time.Millisecond, RPS: 3000, Count: 30000, ServiceReplays: 3, ReplaysRead: true}
	m[rowReplay] = sample{P50: time.Millisecond / 2, P99: 2 * time.Millisecond, RPS: 1500, Count: 15000, ServiceReplays: 15000, ReplaysRead: true}
	var b strings.Builder
	writeReport(&b, []round{{Samples: m, Start: loadAvg{1, 2, 3}, Stop: loadAvg{4, 5, 6}}}, "settings line")
	report := b.String()
	for _, line := range []string{
		"settings line\n",
		"| gated p50 / (ungated p50 + floor pair p50), 1 caller | ≤ 1.5 | 2.50 | 2.50 to 2.50 | no |\n",
		"| after-reply p50 / (ungated p50 + floor pair p50 / 2), 1 caller: one commit, half the floor pair, on the caller's path | ≤ 1.2 | 1.20 | 1.20 to 1.20 | yes |\n",
		"| gated req/s / floor pair tps, 16 callers | ≥ 1 | 0.50 | 0.50 to 0.50 | no |\n",
		"| gated best req/s / floor pair best tps, each over 1, 16 and 64 callers | ≥ 1 | 0.60 | 0.60 to 0.60 | no |\n",
		"| in-process best req/s (1, 64 callers) / floor pair best tps | ≥ 1 | n/a | n/a | n/a |\n",
		"| embedded store end to end, req/s at 64 callers | ≥ 3,000 | 3100 | 3100 to 3100 | yes |\n",
		"| row (medians across rounds) | p50 | p99 | req/s | calls (all rounds) | errors (all rounds) | replay cache hits (all rounds, from metrics) |\n",
		"| replay pg c=1 | 500µs | 2.00ms | 1500 | 15000 | 0 | 0.000 (15000 of 15000 calls replayed by the service) |\n",
		"| replay cached pg c=1 | 250µs | 1.00ms | 3000 | 30000 | 0 | 1.000 (3 of 30000 calls replayed by the service) |\n",
		"| floor pair c=16 | - | - | 2000 | 0 | 0 | - |\n",
		"| 1 | 1.00, 2.00, 3.00 | 4.00, 5.00, 6.00 |\n",
	} {
		if !strings.Contains(report, line) {
			t.Errorf("the report lacks %q:\n%s", line, report)
		}
	}
	if strings.Contains(report, "| gated pg in-process c=1 |") {
		t.Error("the report has a row that did not run")
	}
	// The rows come in run order: the after-reply and in-process rows
	// after the plain gated ones, the floor at 16 between 1 and 64.
	order := []rowID{rowPG64, rowAfterReply1, rowAfterReply64, rowInProcess64, rowSQLite64, rowFloor1, rowFloor16, rowFloor64}
	last := -1
	for _, id := range order {
		i := strings.Index(report, "| "+string(id)+" |")
		if i < last {
			t.Errorf("row %s is out of run order", id)
		}
		last = i
	}
}

func TestParseReplays(t *testing.T) {
	const exposition = `# HELP idemgate_dedupe_outcomes_total Dedupe service answers by outcome.
# TYPE idemgate_dedupe_outcomes_total counter
idemgate_dedupe_outcomes_total{outcome="replayed"} 7
# HELP idemgate_dedupe_replays_total Duplicates answered with a stored outcome.
# TYPE idemgate_dedupe_replays_total counter
idemgate_dedupe_replays_total{method="/examples.payments.v1.PaymentsService/ChargeCard"} 1234
idemgate_dedupe_replays_total{method="other"} 6 1764500000000
idemgate_dedupe_replays_total_extra 99
idemgate_dedupe_replay_counts_dropped_total 5
`
	n, err := parseReplays(exposition)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1240 {
		t.Errorf("replays = %v, want 1240: every method's series, nothing else", n)
	}
	if n, err := parseReplays("idemgate_dedupe_outcomes_total{outcome=\"reserved\"} 1\n"); err != nil || n != 0 {
		t.Errorf("a Dedupe service that served no replay yet: %v, %v; want 0", n, err)
	}
	if _, err := parseReplays("go_goroutines 12\n"); err == nil {
		t.Error("metrics without the Dedupe service's counters read as no replays")
	}
	if _, err := parseReplays("idemgate_dedupe_outcomes_total{outcome=\"x\"} 1\nidemgate_dedupe_replays_total{method=\"m\"} many\n"); err == nil {
		t.Error("an unparsable value parsed")
	}
}

func TestParseGhz(t *testing.T) {
	const report = `{"count":120,"total":2000000000,"rps":60.5,
		"statusCodeDistribution":{"OK":118,"Unavailable":2},"errorDistribution":{"rpc error: code = Unavailable":2},
		"latencyDistribution":[{"percentage":10,"latency":1000},{"percentage":50,"latency":1500000},{"percentage":99,"latency":9000000}],
		"details":[{"latency":1}]}`
	s, _, err := parseGhz(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	want := sample{P50: 1500 * time.Microsecond, P99: 9 * time.Millisecond, RPS: 60.5, Count: 120, Errors: 2}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("parseGhz = %+v, want %+v", s, want)
	}
	if _, _, err := parseGhz(strings.NewReader(`{"count":3,"statusCodeDistribution":{"OK":3}}`)); err == nil {
		t.Error("a report of successful calls without percentiles parsed")
	}
}

func TestParsePgbench(t *testing.T) {
	const out = `pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: floor.sql
query mode: prepared
number of clients: 64
number of transactions actually processed: 1215
number of failed transactions: 3 (0.246%)
latency average = 88.685 ms
initial connection time = 466.575 ms
tps = 721.659282 (without initial connection time)
`
	sum, err := parsePgbenchSummary(out)
	if err != nil {
		t.Fatal(err)
	}
	if sum != (pgbenchSummary{TPS: 721.659282, Processed: 1215, Failed: 3}) {
		t.Errorf("summary = %+v", sum)
	}
	if _, err := parsePgbenchSummary("pgbench: error: connection refused\n"); err == nil {
		t.Error("output without a tps line parsed")
	}

	const log = "0 0 812 0 1764500000 123456\n1 0 failed 0 1764500000 123999\n0 1 1200 0 1764500001 2345\n"
	lat, err := parsePgbenchLog(strings.NewReader(log), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(lat, []time.Duration{812 * time.Microsecond, 1200 * time.Microsecond}) {
		t.Errorf("latencies = %v", lat)
	}
	if _, err := parsePgbenchLog(strings.NewReader("garbage\n"), nil); err == nil {
		t.Error("a malformed log line parsed")
	}
	s := pgbenchSample(sum, []time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond})
	if s.P50 != 2*time.Millisecond || s.P99 != 3*time.Millisecond || s.RPS != sum.TPS || s.Errors != 3 {
		t.Errorf("sample = %+v", s)
	}
}

func TestParseLoadAvg(t *testing.T) {
	l, err := parseLoadAvg("27.76 27.17 15.09 9/812 4242\n")
	if err != nil {
		t.Fatal(err)
	}
	if l != (loadAvg{27.76, 27.17, 15.09}) || l.String() != "27.76, 27.17, 15.09" {
		t.Errorf("load = %v", l)
	}
	if _, err := parseLoadAvg(""); err == nil {
		t.Error("an empty load average parsed")
	}
}

func TestRenderFloor(t *testing.T) {
	key := "k-123"
	reserve := statement{
		SQL:  "WITH reserved AS (INSERT INTO t (ns, scope, key, fp, lease) VALUES ($3, $1, $2, $4, $5::bigint) ON CONFLICT DO NOTHING RETURNING epoch) SELECT reserved.epoch, $5 FROM reserved",
		Args: []any{"scope/a", key, "", []byte{0xca, 0xfe}, int64(10000)},
	}
	var none *string
	finish := statement{
		SQL:  "UPDATE t SET v = $10, key_id = $2 WHERE key = $1 AND ok = $3 AND epoch = $4",
		Args: []any{key, none, true, int64(7), 0, 0, 0, 0, 0, "ten"},
	}
	fs, err := renderFloor(reserve, finish, key, 7)
	if err != nil {
		t.Fatal(err)
	}
	wantScript := "\\set key random(1, 999999999999999)\n" +
		"WITH reserved AS (INSERT INTO t (ns, scope, key, fp, lease) VALUES ('', :r1, :key, :r4, :r5::bigint) ON CONFLICT DO NOTHING RETURNING epoch) SELECT reserved.epoch AS floor_epoch, :r5 FROM reserved \\gset\n" +
		"UPDATE t SET v = :f10, key_id = NULL WHERE key = :key AND ok = :f3 AND epoch = :floor_epoch;\n"
	if !strings.HasSuffix(fs.Script, wantScript) {
		t.Errorf("script:\n%s\nwant it to end with:\n%s", fs.Script, wantScript)
	}
	// $10 must not be read as $1 followed by 0; $5 is bound once.
	wantVars := []string{"r1=scope/a", `r4=\xcafe`, "r5=10000", "f10=ten", "f3=true"}
	if !slices.Equal(fs.Vars, wantVars) {
		t.Errorf("vars = %q, want %q", fs.Vars, wantVars)
	}

	// Batched, each pair has its own key; the reserves share one pipeline
	// (one implicit transaction), the Finishes another, whose epoch check
	// compares the column with itself, since a pipeline cannot \gset.
	wantBatched := "\\set key1 random(1, 999999999999999)\n\\set key2 random(1, 999999999999999)\n\\startpipeline\n" +
		"WITH reserved AS (INSERT INTO t (ns, scope, key, fp, lease) VALUES ('', :r1, :key1, :r4, :r5::bigint) ON CONFLICT DO NOTHING RETURNING epoch) SELECT reserved.epoch AS floor_epoch, :r5 FROM reserved;\n" +
		"WITH reserved AS (INSERT INTO t (ns, scope, key, fp, lease) VALUES ('', :r1, :key2, :r4, :r5::bigint) ON CONFLICT DO NOTHING RETURNING epoch) SELECT reserved.epoch AS floor_epoch, :r5 FROM reserved;\n" +
		"\\endpipeline\n\\startpipeline\n" +
		"UPDATE t SET v = :f10, key_id = NULL WHERE key = :key1 AND ok = :f3 AND epoch = epoch;\n" +
		"UPDATE t SET v = :f10, key_id = NULL WHERE key = :key2 AND ok = :f3 AND epoch = epoch;\n" +
		"\\endpipeline\n"
	got, err := fs.batched(2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(got, wantBatched) {
		t.Errorf("batched(2):\n%s\nwant it to end with:\n%s", got, wantBatched)
	}
	aliased := fs
	aliased.finish = strings.Replace(fs.finish, "epoch = :floor_epoch", "r.epoch = :floor_epoch", 1)
	if got, err := aliased.batched(1); err != nil || !strings.Contains(got, "r.epoch = r.epoch;") {
		t.Errorf("batched with an aliased epoch check: %v\n%s", err, got)
	}
	if _, err := (floorScript{finish: "UPDATE t SET v = 1"}).batched(2); err == nil {
		t.Error("batched a Finish without an epoch check")
	}

	for name, bad := range map[string]statement{
		"missing argument":  {SQL: "SELECT reserved.epoch, $2", Args: []any{key}},
		"unsupported type":  {SQL: "SELECT reserved.epoch, $1, $2", Args: []any{key, 1.5}},
		"semicolon in text": {SQL: "SELECT reserved.epoch, $1; SELECT 1", Args: []any{key}},
		"no epoch returned": {SQL: "SELECT $1", Args: []any{key}},
	} {
		if _, err := renderFloor(bad, finish, key, 7); err == nil {
			t.Errorf("%s: rendered", name)
		}
	}
	if _, err := renderFloor(reserve, finish, key, 8); err == nil {
		t.Error("a Finish that does not bind the captured epoch rendered")
	}
	if _, err := renderFloor(statement{SQL: "SELECT reserved.epoch, 1"}, statement{SQL: "SELECT 2"}, key, 7); err == nil {
		t.Error("statements that never bind the key rendered")
	}
}

func TestGroupThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 3000: "3,000", 1234567: "1,234,567"} {
		if got := groupThousands(n); got != want {
			t.Errorf("groupThousands(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestDeadPid(t *testing.T) {
	if _, ok := deadPid(strconv.Itoa(os.Getpid()) + "_abc_svc"); ok {
		t.Error("this process counts as dead")
	}
	if _, ok := deadPid("notapid_svc"); ok {
		t.Error("a name without a pid counts as a dead run's")
	}
	if _, ok := deadPid("12345"); ok {
		t.Error("a name without a separator after the pid counts as a dead run's")
	}
}

func TestParseStagesAndTheBudget(t *testing.T) {
	before, err := parseStages(`# TYPE idemgate_interceptor_stage_seconds histogram
idemgate_interceptor_stage_seconds_bucket{method="/a/B",stage="begin",le="+Inf"} 10
idemgate_interceptor_stage_seconds_sum{method="/a/B",stage="begin"} 0.01
idemgate_interceptor_stage_seconds_count{method="/a/B",stage="begin"} 10
idemgate_interceptor_stage_seconds_bucket{method="/a/C",stage="begin",le="+Inf"} 5
idemgate_interceptor_stage_seconds_sum{method="/a/C",stage="begin"} 0.005
idemgate_interceptor_stage_seconds_count{method="/a/C",stage="begin"} 5
`)
	if err != nil {
		t.Fatal(err)
	}
	if got := before[stageKey{"tool", "", "begin"}]; got.count != 15 || math.Abs(got.sum-0.015) > 1e-12 {
		t.Fatalf("tool begin = %+v, want both methods summed: 15 observations, 0.015s", got)
	}
	after, err := parseStages(`# TYPE idemgate_dedupe_stage_seconds histogram
idemgate_dedupe_stage_seconds_bucket{rpc="Begin",stage="statement",le="+Inf"} 4
idemgate_dedupe_stage_seconds_sum{rpc="Begin",stage="statement"} 0.002
idemgate_dedupe_stage_seconds_count{rpc="Begin",stage="statement"} 4
# TYPE idemgate_interceptor_stage_seconds histogram
idemgate_interceptor_stage_seconds_bucket{method="/a/B",stage="begin",le="+Inf"} 25
idemgate_interceptor_stage_seconds_sum{method="/a/B",stage="begin"} 0.04
idemgate_interceptor_stage_seconds_count{method="/a/B",stage="begin"} 25
idemgate_interceptor_stage_seconds_bucket{method="/a/C",stage="begin",le="+Inf"} 5
idemgate_interceptor_stage_seconds_sum{method="/a/C",stage="begin"} 0.005
idemgate_interceptor_stage_seconds_count{method="/a/C",stage="begin"} 5
`)
	if err != nil {
		t.Fatal(err)
	}
	b := budgetBetween(before, after)
	// 15 more begins took 0.03s: 2ms each; 4 statements took 0.002s.
	if got := b[stageKey{"tool", "", "begin"}]; got != 2*time.Millisecond {
		t.Errorf("tool begin mean = %s, want 2ms", got)
	}
	if got := b[stageKey{"service", "Begin", "statement"}]; got != 500*time.Microsecond {
		t.Errorf("service statement mean = %s, want 500µs", got)
	}
	// One handler run among 1,000 Begins (a replay row's first call) is
	// not the row's: left out.
	few := budgetBetween(map[stageKey]stageSum{}, map[stageKey]stageSum{
		{"tool", "", "begin"}: {count: 1000, sum: 0.5}, {"tool", "", "handler"}: {count: 1, sum: 0.001}, {"tool", "", "prepare"}: {count: 1000, sum: 0.01},
	})
	if _, ok := few[stageKey{"tool", "", "handler"}]; ok || len(few) != 2 {
		t.Errorf("budget of a replay row = %v, want begin and prepare only", few)
	}
	if _, err := parseStages("go_goroutines 3\n"); err == nil {
		t.Error("an exposition without stage histograms parsed")
	}

	var out strings.Builder
	writeBudget(&out, []round{{Samples: map[rowID]sample{rowPG1: {P50: 3 * time.Millisecond, Budget: b}}}}, rowPG1)
	for _, want := range []string{
		"| tool server: Begin round trip (begin) | 2.00ms |",
		"|   service Begin: statement, round trip and commit | 500µs |",
		"| the two hops of Begin (tool server's round trip less the service's stages) | 1.50ms |",
		"(p50 3.00ms less the tool server's stages) | 1.00ms |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the budget lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseConfigDedupeFlags(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"-ghz", self, "-pgbench", self}
	cfg, err := parseConfig(append(base, "-dedupe-flags", " -store-writers=8  -store-max-batch=16 "), func(string) string { return "" })
	if err != nil || !reflect.DeepEqual(cfg.dedupeFlags, []string{"-store-writers=8", "-store-max-batch=16"}) {
		t.Fatalf("parseConfig = %q, %v; want the two flags", cfg.dedupeFlags, err)
	}
	cfg, err = parseConfig(base, func(k string) string {
		if k == "LOADTEST_DEDUPE_FLAGS" {
			return "-store-writers=4"
		}
		return ""
	})
	if err != nil || !reflect.DeepEqual(cfg.dedupeFlags, []string{"-store-writers=4"}) {
		t.Fatalf("parseConfig from LOADTEST_DEDUPE_FLAGS = %q, %v", cfg.dedupeFlags, err)
	}
	if _, err := parseConfig(append(base, "-dedupe-flags", "store-writers=8"), func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "not a flag") {
		t.Fatalf("a value without its dash: %v, want it refused as not a flag", err)
	}
	if got := extraFlags([]string{"-store-writers=8"}); got != "; every Dedupe service also with -store-writers=8" {
		t.Errorf("extraFlags = %q", got)
	}
}

func TestPgConfLinesSplitsSettings(t *testing.T) {
	if got, want := pgConfLines(" autovacuum = off ; ; log_autovacuum_min_duration = 0"), "autovacuum = off\nlog_autovacuum_min_duration = 0\n"; got != want {
		t.Fatalf("pgConfLines = %q, want %q", got, want)
	}
	if got := pgConfLines(""); got != "" {
		t.Fatalf("pgConfLines(\"\") = %q, want nothing", got)
	}
}
