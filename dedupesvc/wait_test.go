package dedupesvc_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
)

// inFlightStore answers every Begin in flight and counts them.
type inFlightStore struct {
	fakeStore
	begins atomic.Int64
}

func (s *inFlightStore) Begin(context.Context, dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	s.begins.Add(1)
	return dedupesvc.BeginResult{State: dedupesvc.BeginInFlight, LeaseExpiresAt: time.Now().Add(time.Hour)}, nil
}

// TestWaitersPastTheCapsAnswerAtOnce: past the per-caller cap a Begin does
// not wait but answers in_flight at once, counted as the waiters quota, and
// another caller still waits.
func TestWaitersPastTheCapsAnswerAtOnce(t *testing.T) {
	t.Parallel()
	store := &inFlightStore{}
	metrics := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(store, dedupesvc.WithMaxWaiters(6, 4), dedupesvc.WithMetrics(metrics), dedupesvc.WithPollInterval(time.Hour))
	const maxWait = 2 * time.Second
	begin := func(caller string) time.Duration {
		req := validBegin()
		req.MaxWait = durationpb.New(maxWait)
		start := time.Now()
		resp, err := srv.Begin(dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: caller}), req)
		if err != nil || resp.GetInFlight() == nil {
			t.Errorf("Begin = %v, %v; want in flight", resp, err)
		}
		return time.Since(start)
	}
	var (
		wg     sync.WaitGroup
		waited atomic.Int64
	)
	for range 7 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if begin("greedy") >= maxWait {
				waited.Add(1)
			}
		}()
	}
	wg.Wait()
	if got := waited.Load(); got != 4 {
		t.Fatalf("%d of 7 Begins of one caller waited, want its cap of 4", got)
	}
	if got := testutil.ToFloat64(metrics.QuotaCounter(dedupesvc.QuotaWaiters)); got != 3 {
		t.Fatalf("idemgate_dedupe_quota_exceeded_total{quota=waiters} = %v, want 3", got)
	}
	if d := begin("neighbour"); d < maxWait {
		t.Fatalf("another caller's Begin answered after %s without waiting", d)
	}
}
