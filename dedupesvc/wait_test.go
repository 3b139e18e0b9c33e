package dedupesvc_test

import (
	"context"
	"fmt"
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

// TestCallersAtTheirCapLeaveRoomForABystander: callers that each stay
// within their own waiter cap fill the pool together (four callers at a cap
// of 5 in a pool of 20); the pool's last places are kept for callers that
// hold few waiters, so a bystander's duplicate still waits instead of
// answering in_flight at once.
func TestCallersAtTheirCapLeaveRoomForABystander(t *testing.T) {
	t.Parallel()
	store := &inFlightStore{}
	metrics := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(store, dedupesvc.WithMaxWaiters(20, 5), dedupesvc.WithMetrics(metrics), dedupesvc.WithPollInterval(time.Hour))
	refused := func() int64 { return int64(testutil.ToFloat64(metrics.QuotaCounter(dedupesvc.QuotaWaiters))) }
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	begin := func(ctx context.Context, caller string) {
		req := validBegin()
		req.MaxWait = durationpb.New(dedupesvc.MaxWait)
		resp, err := srv.Begin(dedupesvc.ContextWithCaller(ctx, dedupesvc.Caller{Name: caller}), req)
		if err != nil || resp.GetInFlight() == nil {
			t.Errorf("Begin = %v, %v; want in flight", resp, err)
		}
	}
	for c := range 4 {
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				begin(ctx, fmt.Sprintf("tenant-%d", c))
			}()
		}
	}
	// Every tenant Begin has either started waiting or been refused.
	for srv.WaitStats().Started+refused() < 20 {
		time.Sleep(10 * time.Millisecond)
	}
	before := refused()
	wg.Add(1)
	go func() {
		defer wg.Done()
		begin(ctx, "bystander")
	}()
	for srv.WaitStats().Started+refused() < 21 {
		time.Sleep(10 * time.Millisecond)
	}
	if refused() != before {
		t.Fatalf("the bystander's Begin did not wait: tenants within their caps (%d waiting, %d refused) filled the pool", srv.WaitStats().Started, before)
	}
	if before == 0 {
		t.Fatal("the tenants' 20 Begins all waited; want the pool's reserve kept from them")
	}
}
