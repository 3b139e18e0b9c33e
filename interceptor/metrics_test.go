package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/metadata"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

func TestMetricsCountWhatHappened(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	dedupeMetrics := dedupesvc.NewMetrics()
	h := setupWith(t, stacktest.Config{
		GateOptions:   []interceptor.Option{interceptor.WithRegisterer(reg), interceptor.WithMaxOutcomeBytes(1024)},
		DedupeMetrics: dedupeMetrics,
	})
	req := &testingv1.MutateRequest{Payload: "charge"}
	h.mutate(withKey("m-1"), req)                                                                 // executed
	h.mutate(withKey("m-1"), req)                                                                 // replayed
	h.mutate(withKey("m-1"), req)                                                                 // replayed
	h.mutate(withKey("m-1"), &testingv1.MutateRequest{Payload: "other"})                          // key_reused
	h.mutate(context.Background(), req)                                                           // key_missing
	h.mutate(metadata.AppendToOutgoingContext(context.Background(), idemgate.KeyHeader, ""), req) // key_invalid
	big := &testingv1.MutateRequest{Payload: strings.Repeat("x", 2000)}
	h.mutate(withKey("m-2"), big)                   // executed, and a result_too_large event
	h.mutate(withKey("m-2"), big)                   // result_too_large
	_, _ = h.client.Read(context.Background(), req) // ungated: not counted

	want := `
# HELP idemgate_interceptor_calls_total Gated calls by method and outcome: executed, replayed, or the reason they were refused.
# TYPE idemgate_interceptor_calls_total counter
idemgate_interceptor_calls_total{method="/idemgate.testing.v1.TestService/Mutate",outcome="executed"} 2
idemgate_interceptor_calls_total{method="/idemgate.testing.v1.TestService/Mutate",outcome="key_invalid"} 1
idemgate_interceptor_calls_total{method="/idemgate.testing.v1.TestService/Mutate",outcome="key_missing"} 1
idemgate_interceptor_calls_total{method="/idemgate.testing.v1.TestService/Mutate",outcome="key_reused"} 1
idemgate_interceptor_calls_total{method="/idemgate.testing.v1.TestService/Mutate",outcome="replayed"} 2
idemgate_interceptor_calls_total{method="/idemgate.testing.v1.TestService/Mutate",outcome="result_too_large"} 1
# HELP idemgate_interceptor_events_total Events the caller does not see, by method: fenced, finish_retry, outcome_lost, release_retry, release_failure, heartbeat_failure, reconciled, result_too_large, begin_lost, replay_cache_hit, replay_cache_miss.
# TYPE idemgate_interceptor_events_total counter
idemgate_interceptor_events_total{event="result_too_large",method="/idemgate.testing.v1.TestService/Mutate"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemgate_interceptor_calls_total", "idemgate_interceptor_events_total"); err != nil {
		t.Fatal(err)
	}

	// The Dedupe service's own counters tell the same story: two
	// reservations finished, three replays (one of them the too-large
	// marker), one mismatch; refused keys never reached it.
	wantDedupe := `
# HELP idemgate_dedupe_outcomes_total Dedupe service answers by outcome.
# TYPE idemgate_dedupe_outcomes_total counter
idemgate_dedupe_outcomes_total{outcome="fenced"} 0
idemgate_dedupe_outcomes_total{outcome="finished"} 2
idemgate_dedupe_outcomes_total{outcome="in_flight"} 0
idemgate_dedupe_outcomes_total{outcome="invalid"} 0
idemgate_dedupe_outcomes_total{outcome="mismatched"} 1
idemgate_dedupe_outcomes_total{outcome="released"} 0
idemgate_dedupe_outcomes_total{outcome="replayed"} 3
idemgate_dedupe_outcomes_total{outcome="reserved"} 2
idemgate_dedupe_outcomes_total{outcome="resolved"} 0
idemgate_dedupe_outcomes_total{outcome="store_errors"} 0
idemgate_dedupe_outcomes_total{outcome="unknown"} 0
idemgate_dedupe_outcomes_total{outcome="waited"} 0
`
	if err := testutil.CollectAndCompare(dedupeMetrics, strings.NewReader(wantDedupe), "idemgate_dedupe_outcomes_total"); err != nil {
		t.Fatal(err)
	}
}

// TestStagesTimeEachPartOfACall: a run is timed in all four stages, a
// replay only before and during its Begin (no handler, nothing to store),
// and the service times its side of the same Begins and Finish.
func TestStagesTimeEachPartOfACall(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	dedupeMetrics := dedupesvc.NewMetrics()
	h := setupWith(t, stacktest.Config{GateOptions: []interceptor.Option{interceptor.WithRegisterer(reg)}, DedupeMetrics: dedupeMetrics})
	req := &testingv1.MutateRequest{Payload: "charge"}
	h.mutate(withKey("s-1"), req) // executed
	h.mutate(withKey("s-1"), req) // replayed
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "idemgate_interceptor_stage_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					counts[l.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	want := map[string]uint64{"prepare": 2, "begin": 2, "handler": 1, "finish": 1}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("tool-side stages observed %v, want %v", counts, want)
	}
	if n := testutil.CollectAndCount(dedupeMetrics, "idemgate_dedupe_stage_seconds"); n != 12 {
		t.Errorf("%d service-side stage series, want 12 (Begin and Finish × 6 stages)", n)
	}
}
