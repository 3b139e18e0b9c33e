package dedupesvc_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

func TestMetricsCountEveryOutcome(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	m := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(store, dedupesvc.WithMetrics(m))
	ctx := context.Background()
	begin := func(state dedupesvc.BeginState) {
		store.begin, store.err = dedupesvc.BeginResult{State: state}, nil
		_, _ = srv.Begin(ctx, validBegin())
	}
	begin(dedupesvc.BeginReserved)
	begin(dedupesvc.BeginReserved)
	begin(dedupesvc.BeginCompleted)
	begin(dedupesvc.BeginFingerprintMismatch)
	begin(dedupesvc.BeginOutcomeUnknown)
	_, _ = srv.Begin(ctx, &idemgatev1.BeginRequest{}) // invalid

	finish := &idemgatev1.FinishRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1, Outcome: &anypb.Any{TypeUrl: "x/y.Z"}}
	store.err = nil
	_, _ = srv.Finish(ctx, finish)
	store.err = dedupesvc.ErrNotHeld
	_, _ = srv.Finish(ctx, finish)
	store.err = errors.New("connection refused")
	_, _ = srv.Release(ctx, &idemgatev1.ReleaseRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1})

	want := `
# HELP idemgate_dedupe_outcomes_total Dedupe service answers by outcome.
# TYPE idemgate_dedupe_outcomes_total counter
idemgate_dedupe_outcomes_total{outcome="fenced"} 1
idemgate_dedupe_outcomes_total{outcome="finished"} 1
idemgate_dedupe_outcomes_total{outcome="in_flight"} 0
idemgate_dedupe_outcomes_total{outcome="invalid"} 1
idemgate_dedupe_outcomes_total{outcome="mismatched"} 1
idemgate_dedupe_outcomes_total{outcome="released"} 0
idemgate_dedupe_outcomes_total{outcome="replayed"} 1
idemgate_dedupe_outcomes_total{outcome="reserved"} 2
idemgate_dedupe_outcomes_total{outcome="resolved"} 0
idemgate_dedupe_outcomes_total{outcome="store_errors"} 1
idemgate_dedupe_outcomes_total{outcome="unknown"} 1
idemgate_dedupe_outcomes_total{outcome="waited"} 0
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "idemgate_dedupe_outcomes_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m, "idemgate_dedupe_rpc_duration_seconds"); n != 3 {
		t.Fatalf("latency series for %d RPCs, want Begin, Finish and Release", n)
	}
}

// stagedStore is a Store whose Begin and Finish report the queue and
// statement times a batching store would.
type stagedStore struct {
	fakeStore
	queued, took time.Duration
}

func (s *stagedStore) Begin(ctx context.Context, p dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	dedupesvc.StageTimerFrom(ctx).AddStatement(s.queued, s.took)
	return s.fakeStore.Begin(ctx, p)
}

func (s *stagedStore) Finish(ctx context.Context, p dedupesvc.FinishParams) error {
	dedupesvc.StageTimerFrom(ctx).AddStatement(s.queued, s.took)
	return s.fakeStore.Finish(ctx, p)
}

// stageSum reads idemgate_dedupe_stage_seconds{rpc,stage}: its count and sum.
func stageSum(t *testing.T, m *dedupesvc.Metrics, rpc, stage string) (uint64, float64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range got {
		if f.GetName() != "idemgate_dedupe_stage_seconds" {
			continue
		}
		for _, metric := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["rpc"] == rpc && labels["stage"] == stage {
				return metric.GetHistogram().GetSampleCount(), metric.GetHistogram().GetSampleSum()
			}
		}
	}
	t.Fatalf("no idemgate_dedupe_stage_seconds{rpc=%q,stage=%q}", rpc, stage)
	return 0, 0
}

func TestStagesSplitEachCall(t *testing.T) {
	t.Parallel()
	store := &stagedStore{queued: 3 * time.Millisecond, took: 5 * time.Millisecond}
	store.begin = dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: 1}
	m := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(store, dedupesvc.WithMetrics(m), dedupesvc.WithCallerRate(0.001, 2))
	ctx := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "a"})
	for range 2 {
		if _, err := srv.Begin(ctx, validBegin()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := srv.Finish(ctx, &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "order-1", AttemptToken: "attempt-1", Epoch: 1, Outcome: &anypb.Any{TypeUrl: "x/y.Z"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Begin(ctx, validBegin()); err == nil {
		t.Fatal("a third Begin past the rate went through")
	}
	for _, c := range []struct {
		rpc, stage string
		count      uint64
		sum        float64 // exact when > 0
	}{
		{"Begin", dedupesvc.StageChecks, 3, 0}, // the refused Begin too
		{"Begin", dedupesvc.StageQueue, 2, 0.006},
		{"Begin", dedupesvc.StageStatement, 2, 0.010},
		{"Begin", dedupesvc.StageStore, 2, 0},
		{"Begin", dedupesvc.StageReply, 2, 0},
		{"Begin", dedupesvc.StageWait, 0, 0},
		{"Finish", dedupesvc.StageQueue, 1, 0.003},
		{"Finish", dedupesvc.StageStatement, 1, 0.005},
	} {
		count, sum := stageSum(t, m, c.rpc, c.stage)
		if count != c.count || (c.sum > 0 && math.Abs(sum-c.sum) > 1e-9) {
			t.Errorf("%s %s: %d observations summing %gs, want %d (sum %g)", c.rpc, c.stage, count, sum, c.count, c.sum)
		}
	}
}

// inFlightStagedStore answers every Begin in flight, reporting a statement
// each time, as a batching store would.
type inFlightStagedStore struct {
	fakeStore
	begins atomic.Int64
}

func (s *inFlightStagedStore) Begin(ctx context.Context, _ dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	s.begins.Add(1)
	dedupesvc.StageTimerFrom(ctx).AddStatement(3*time.Millisecond, 5*time.Millisecond)
	return dedupesvc.BeginResult{State: dedupesvc.BeginInFlight, LeaseExpiresAt: time.Now().Add(time.Hour)}, nil
}

// TestStagesOfAWaitedBegin: the re-reads of a Begin that waits for an
// in-flight outcome are its wait stage, not more statements of its store
// stage (which would then count twice and leave the store stage negative).
func TestStagesOfAWaitedBegin(t *testing.T) {
	t.Parallel()
	store := &inFlightStagedStore{}
	m := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(store, dedupesvc.WithMetrics(m), dedupesvc.WithPollInterval(10*time.Millisecond))
	req := validBegin()
	req.MaxWait = durationpb.New(300 * time.Millisecond)
	if resp, err := srv.Begin(context.Background(), req); err != nil || resp.GetInFlight() == nil {
		t.Fatalf("Begin = %v, %v; want in flight after the wait", resp, err)
	}
	if n := store.begins.Load(); n < 2 {
		t.Fatalf("the store was read %d times, want the first read and at least one re-read while waiting", n)
	}
	if count, sum := stageSum(t, m, "Begin", dedupesvc.StageStatement); count != 1 || math.Abs(sum-0.005) > 1e-9 {
		t.Errorf("Begin statement stage: %d observations summing %gs; want the first read's 5ms only", count, sum)
	}
	if count, _ := stageSum(t, m, "Begin", dedupesvc.StageWait); count != 1 {
		t.Errorf("Begin wait stage: %d observations, want 1", count)
	}
}
