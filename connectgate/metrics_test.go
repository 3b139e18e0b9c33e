package connectgate_test

import (
	"testing"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/gen/idemgate/testing/v1/testingv1connect"
)

// TestMetricsAndStats: a gated call, its replay from the replay cache, a
// keyless refusal and a released failure move
// idemgate_connectgate_calls_total, events_total and stage_seconds, Stats
// counts the replay cache hit, and a second Gate on the same registry shares
// the collectors instead of failing New.
func TestMetricsAndStats(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	hs := setup(t, nil, connectgate.WithRegisterer(reg), connectgate.WithReplayCache(16, 1<<20))
	ctx := testCtx(t)
	client := hs.client()
	const proc = testingv1connect.TestServiceMutateProcedure
	msg := &testingv1.MutateRequest{Payload: "metered"}
	if _, err := client.Mutate(ctx, keyed("metrics-1", msg)); err != nil {
		t.Fatal(err)
	}
	again, err := client.Mutate(ctx, keyed("metrics-1", msg))
	if err != nil {
		t.Fatal(err)
	}
	if again.Header().Get(idemgate.ReplayedHeader) != "true" {
		t.Fatalf("the duplicate was not replayed: headers %v", again.Header())
	}
	_, err = client.Mutate(ctx, keyed("", msg))
	wantError(t, err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_MISSING")
	// An unmarked UNAVAILABLE is not an outcome: the key is released.
	if _, err := client.Mutate(ctx, keyed("metrics-2", &testingv1.MutateRequest{Payload: "failing", FailCode: int32(connect.CodeUnavailable)})); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a failing handler answered %v, want its UNAVAILABLE", err)
	}

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"calls", map[string]string{"procedure": proc, "outcome": "executed"}, 1},
		{"calls", map[string]string{"procedure": proc, "outcome": "replayed"}, 1},
		{"calls", map[string]string{"procedure": proc, "outcome": "key_missing"}, 1},
		{"calls", map[string]string{"procedure": proc, "outcome": "released"}, 1},
		{"events", map[string]string{"procedure": proc, "event": "replay_cache_miss"}, 2},
		{"events", map[string]string{"procedure": proc, "event": "replay_cache_hit"}, 1},
	} {
		name := "idemgate_connectgate_" + c.name + "_total"
		got := counterValue(t, reg, name, c.labels)
		if got != c.want {
			t.Errorf("%s%v = %v, want %v", name, c.labels, got, c.want)
		}
	}
	for _, stage := range []string{"prepare", "begin", "handler", "finish"} {
		if n := histogramCount(t, reg, "idemgate_connectgate_stage_seconds", map[string]string{"procedure": proc, "stage": stage}); n == 0 {
			t.Errorf("idemgate_connectgate_stage_seconds{%s,%s} observed nothing", proc, stage)
		}
	}
	if got := testutil.CollectAndCount(reg, "idemgate_connectgate_calls_total"); got != 4 {
		t.Errorf("idemgate_connectgate_calls_total has %d series, want 4 (executed, replayed, key_missing, released)", got)
	}
	if s := hs.gate.Stats(); s.ReplayCacheHits != 1 || s.ReplayCacheMisses != 2 {
		t.Errorf("Stats %+v: want 1 replay cache hit and 2 misses", s)
	}

	// A second Gate on the registry takes the collectors already there.
	if _, err := connectgate.New(hs.stack.Dedupe, connectgate.WithRegisterer(reg)); err != nil {
		t.Fatalf("a second Gate on one registry: %v", err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("gather after a second Gate: %v", err)
	}
}

// counterValue is the value of the counter of name with labels in reg, 0
// when it has none.
func counterValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	if m := metricOf(t, reg, name, labels); m != nil {
		return m.GetCounter().GetValue()
	}
	return 0
}

// histogramCount is the sample count of the histogram of name with labels.
func histogramCount(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	if m := metricOf(t, reg, name, labels); m != nil {
		return m.GetHistogram().GetSampleCount()
	}
	return 0
}

// metricOf is the metric of name with exactly the labels given (name to
// value); nil when reg has none.
func metricOf(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}
