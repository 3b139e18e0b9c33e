package main

import (
	"slices"
	"strings"
	"testing"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// ambiguousFailClosed counts the FAIL_CLOSED actions that fail ambiguously:
// the ones a gate that releases keys after such a failure runs twice.
func ambiguousFailClosed(actions []action) int {
	n := 0
	for _, a := range actions {
		if a.method == testingv1.ChaosService_Charge_FullMethodName && strings.Contains(a.key, "-a") {
			n++
		}
	}
	return n
}

// TestPlanAmbiguousFailClosed holds -ambiguous-fail-closed to its promise
// in every seed, so a scenario with it fails under a broken gate whatever
// the seed, and holds the plans of runs without it to what they were.
func TestPlanAmbiguousFailClosed(t *testing.T) {
	t.Parallel()
	short := 0
	for seed := uint64(1); seed <= 200; seed++ {
		c := config{seed: seed, actions: 30, reexecute: 0.5, pause: 0.6, ambiguous: 0.05}
		before := plan(c)
		if ambiguousFailClosed(before) == 0 {
			short++
		}
		c.ambiguousFailClosed = 2
		after := plan(c)
		if got := ambiguousFailClosed(after); got < 2 {
			t.Fatalf("seed %d: %d ambiguous FAIL_CLOSED actions, want at least 2: %v", seed, got, after)
		}
		changed := 0
		for i := range after {
			if after[i] == before[i] {
				continue
			}
			changed++
			if before[i].method != testingv1.ChaosService_Charge_FullMethodName || after[i].key != before[i].key+"-a" || after[i].method != before[i].method {
				t.Fatalf("seed %d: %+v became %+v: only FAIL_CLOSED actions may turn ambiguous", seed, before[i], after[i])
			}
		}
		if want := max(0, 2-ambiguousFailClosed(before)); changed != want {
			t.Fatalf("seed %d: %d actions changed, want %d", seed, changed, want)
		}
		c.ambiguousFailClosed = 0
		if again := plan(c); !slices.Equal(again, before) {
			t.Fatalf("seed %d: the plan without -ambiguous-fail-closed changed", seed)
		}
	}
	if short == 0 {
		t.Fatal("every seed drew an ambiguous FAIL_CLOSED action on its own: the test proves nothing")
	}
}
