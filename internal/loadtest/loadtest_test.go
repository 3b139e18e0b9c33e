package main

import (
	"math"
	"os"
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
	if got[rowPG1] != want {
		t.Errorf("medians = %+v, want %+v", got[rowPG1], want)
	}
	if _, ok := got[rowPG64]; ok {
		t.Error("a row that never ran has a median")
	}
}

func TestGoals(t *testing.T) {
	ms := time.Millisecond
	m := map[rowID]sample{
		rowUngated:      {P50: ms / 5},
		rowFloor1:       {P50: ms},
		rowPG1:          {P50: 3 * ms},
		rowPG16:         {RPS: 1000},
		rowPG64:         {RPS: 1200},
		rowFloor64:      {RPS: 1500},
		rowReplay:       {P50: ms / 2},
		rowReplayCached: {P50: ms / 4},
		rowSQLite64:     {RPS: 1100},
	}
	rounds := []round{{Samples: m}, {Samples: map[rowID]sample{rowSQLite64: {RPS: 900}}}}
	out := evaluate(rounds, m)
	want := []struct {
		value    float64
		met      bool
		min, max float64
	}{
		{3 / 1.2, false, 3 / 1.2, 3 / 1.2}, // 3ms / (0.2ms + 1ms)
		{0.8, false, 0.8, 0.8},             // 1200 / 1500
		{2.5, false, 2.5, 2.5},             // 0.5ms / 0.2ms
		{1.25, true, 1.25, 1.25},           // 0.25ms / 0.2ms
		{1.2, true, 1.2, 1.2},              // 1200 / 1000
		{1100, false, 900, 1100},           // absolute, each round
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
	if o := evaluate(nil, map[rowID]sample{rowPG1: {P50: ms}})[0]; o.OK || o.Met() {
		t.Errorf("a goal whose rows did not run: ok %v, met %v", o.OK, o.Met())
	}
	noCache := map[rowID]sample{rowUngated: {P50: ms / 5}, rowReplay: {P50: ms / 2}}
	for _, o := range evaluate([]round{{Samples: noCache}}, noCache) {
		if o.Name == "cached replay p50 / ungated p50, 1 caller" && (o.OK || o.Met()) {
			t.Errorf("the cached replay goal without its row: ok %v, met %v", o.OK, o.Met())
		}
		if o.Name == "replay p50 / ungated p50, 1 caller" && !o.OK {
			t.Error("the replay goal needs the cached replay row")
		}
	}
	if o := (outcome{goal: goals[0], Value: 1.2, OK: true}); !o.Met() {
		t.Error("a value equal to an at-most goal does not meet it")
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
	if s != want {
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
