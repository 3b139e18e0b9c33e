package main

import (
	"strings"
	"testing"
	"time"
)

func TestCPUBetweenAndPerThousand(t *testing.T) {
	before := map[cpuRole]time.Duration{roleTool: time.Second, roleService: 3 * time.Second, rolePG: 5 * time.Second}
	after := map[cpuRole]time.Duration{roleTool: 3 * time.Second, roleService: time.Second, rolePG: 9 * time.Second, roleClient: time.Second}
	got := cpuBetween(before, after)
	want := map[cpuRole]time.Duration{roleTool: 2 * time.Second, rolePG: 4 * time.Second}
	if len(got) != len(want) || got[roleTool] != want[roleTool] || got[rolePG] != want[rolePG] {
		t.Errorf("cpuBetween = %v, want %v (a count that went back or was not read before is left out)", got, want)
	}
	if v, ok := perThousand(4*time.Second, 8000); !ok || v != 0.5 {
		t.Errorf("perThousand(4s, 8000) = %v, %v; want 0.5 CPU-s per 1,000 calls", v, ok)
	}
	if _, ok := perThousand(time.Second, 0); ok {
		t.Error("perThousand of no calls is a value")
	}
}

// The CPU table gives each role's median per 1,000 successful calls across
// rounds, the servers' sum without the load generator, the write
// transactions and WAL per call, and the capacity line of the database's
// roles (PostgreSQL, or the Citus nodes together).
func TestWriteCPU(t *testing.T) {
	s := func(calls int64, tool, pg, client time.Duration, xids, wal int64) sample {
		return sample{Count: calls + 10, Errors: 10, RPS: float64(calls) / 10,
			CPU: map[cpuRole]time.Duration{roleTool: tool, rolePG: pg, roleClient: client}, Xids: xids, WAL: wal, CountsRead: true}
	}
	rounds := []round{
		{Samples: map[rowID]sample{rowPG64: s(10000, 3*time.Second, 7*time.Second, time.Second, 2000, 20_000_000)}},
		{Samples: map[rowID]sample{rowPG64: s(10000, 5*time.Second, 9*time.Second, time.Second, 4000, 20_000_000),
			rowCitus64: {Count: 1000, RPS: 100, CPU: map[cpuRole]time.Duration{roleCoord: time.Second, roleWorker1: 2 * time.Second, roleWorker2: 2 * time.Second}}}},
	}
	// Idle, the server spends 0.1 CPU-s a second: over a 10 s row of
	// 10,000 calls that is 1 CPU-s, 0.1 per 1,000 calls.
	for i := range rounds {
		rounds[i].Samples[rowIdlePG] = sample{Elapsed: 10 * time.Second, CPU: map[cpuRole]time.Duration{rolePG: time.Second, roleTool: 0}}
		pg := rounds[i].Samples[rowPG64]
		pg.Elapsed = 10 * time.Second
		rounds[i].Samples[rowPG64] = pg
	}
	var b strings.Builder
	writeCPU(&b, rounds)
	out := b.String()
	for _, want := range []string{
		// tool 0.3 and 0.5 → 0.4; PostgreSQL 0.7 and 0.9 → 0.8; client 0.1;
		// servers 1.2; 0.2 and 0.4 transactions → 0.3; 2,000 WAL bytes.
		"| gated pg c=64 | 1000 | 0.400 | - | 0.800 | - | - | - | 0.100 | 1.200 | 0.30 | 2000 |",
		"| gated citus c=64 | 100 | - | - | - | 1.000 | 2.000 | 2.000 | - | 5.000 | - | - |",
		"| gated pg c=64 | 0.800 | 1250 | 0.700 | 1429 |",
		"| idle pg (no calls): CPU-s per second, medians across rounds | value |\n| --- | ---: |\n| tool server | 0.0000 |\n| PostgreSQL | 0.1000 |",
		"| gated citus c=64 | 5.000 | 200 | - | - |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

func TestParseStores(t *testing.T) {
	for in, want := range map[string][]string{"postgres": {"postgres"}, "postgres,citus": {"citus", "postgres"}, " citus , postgres ": {"citus", "postgres"}} {
		got, err := parseStores(in)
		if err != nil {
			t.Fatalf("parseStores(%q): %v", in, err)
		}
		if len(got) != len(want) {
			t.Errorf("parseStores(%q) = %v, want %v", in, got, want)
		}
		for _, w := range want {
			if !got[w] {
				t.Errorf("parseStores(%q) = %v, want %v", in, got, want)
			}
		}
	}
	for _, bad := range []string{"citus", "", "postgres,mysql"} {
		if _, err := parseStores(bad); err == nil {
			t.Errorf("parseStores(%q) took it", bad)
		}
	}
}

// A harness turns a Fatalf into an error at catch, runs its cleanups last
// registered first, and counts an Errorf as a failure.
func TestHarness(t *testing.T) {
	h := &harness{}
	var order []int
	err := catch(func() {
		h.Cleanup(func() { order = append(order, 1) })
		h.Cleanup(func() { order = append(order, 2) })
		h.Fatalf("pgtest: %s", "no server")
		t.Error("Fatalf returned")
	})
	if err == nil || err.Error() != "pgtest: no server" {
		t.Errorf("catch = %v, want the Fatalf's message", err)
	}
	if !h.Failed() {
		t.Error("Failed() = false after Fatalf")
	}
	h.close()
	if len(order) != 2 || order[0] != 2 || order[1] != 1 {
		t.Errorf("cleanups ran %v, want [2 1]", order)
	}
	if err := catch(func() {}); err != nil {
		t.Errorf("catch of nothing failing = %v", err)
	}
	defer func() {
		if r := recover(); r != "other" {
			t.Errorf("another panic: recovered %v, want it to go on", r)
		}
	}()
	_ = catch(func() { panic("other") })
}
