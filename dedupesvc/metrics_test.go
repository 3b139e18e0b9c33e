package dedupesvc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/anypb"

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
