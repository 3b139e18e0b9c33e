package dedupesvc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
)

// The gauge counts the outcome-unknown records in the store, across pages,
// and no others; it is absent until the first count.
func TestUnknownRecordsGauge(t *testing.T) {
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	begin := func(key, token string, lease time.Duration) dedupesvc.BeginResult {
		t.Helper()
		res, err := store.Begin(ctx, dedupesvc.BeginParams{Scope: "/pkg.S/M", Key: key, Fingerprint: []byte("fp"), AttemptToken: token,
			Lease: lease, Retention: time.Hour, UnknownRetention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// More than one page of unknown records: reserved with a lease that runs
	// out, then found by a duplicate (FAIL_CLOSED marks them unknown).
	const unknown = 1003
	for i := range unknown {
		begin(fmt.Sprintf("lost-%d", i), "crashed", time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	for i := range unknown {
		if res := begin(fmt.Sprintf("lost-%d", i), "duplicate", time.Hour); res.State != dedupesvc.BeginOutcomeUnknown {
			t.Fatalf("duplicate Begin = %v, want outcome unknown", res.State)
		}
	}
	// Neither a live reservation nor a completed record counts.
	begin("running", "holder", time.Hour)
	done := begin("done", "holder", time.Hour)
	if err := store.Finish(ctx, dedupesvc.FinishParams{Scope: "/pkg.S/M", Key: "done", AttemptToken: "holder", Epoch: done.Epoch,
		Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/google.protobuf.Empty", Value: (&anypb.Any{}).GetValue()}}); err != nil {
		t.Fatal(err)
	}

	gauge := dedupesvc.NewUnknownRecords(store, dedupesvc.UnknownRecordsConfig{})
	if n := testutil.CollectAndCount(gauge); n != 0 {
		t.Fatalf("%d series before the first count, want none (absent, not a made-up zero)", n)
	}
	n, err := gauge.CountOnce(ctx)
	if err != nil || n != unknown {
		t.Fatalf("CountOnce = %d, %v; want %d", n, err, unknown)
	}
	if got := testutil.ToFloat64(gauge); got != unknown {
		t.Fatalf("idemgate_records_outcome_unknown = %v, want %d", got, unknown)
	}
}
