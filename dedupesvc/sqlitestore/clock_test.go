package sqlitestore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

// TestLeasesFollowTheMonotonicClock: the store judges leases by the wall time
// at opening plus the monotonic time elapsed since, never by reading the
// wall clock again, so a step of the system clock changes no lease.
func TestLeasesFollowTheMonotonicClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opened := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC) // far from the real wall clock
	var elapsed atomic.Int64
	s, err := open(ctx, t.TempDir(), opened, func() time.Duration { return time.Duration(elapsed.Load()) })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := dedupesvc.BeginParams{Scope: "/a.B/C", Key: "k", Fingerprint: make([]byte, 32), AttemptToken: "t1",
		Lease: time.Second, Retention: time.Hour, OnLostOutcome: dedupesvc.Reexecute}
	held, err := s.Begin(ctx, p)
	if err != nil || held.State != dedupesvc.BeginReserved || !held.LeaseExpiresAt.Equal(opened.Add(time.Second)) {
		t.Fatalf("Begin = %+v, %v; want reserved until a second after opening", held, err)
	}
	p.AttemptToken = "t2"
	// However much real time passes, the lease runs until the monotonic clock
	// says so.
	time.Sleep(1100 * time.Millisecond)
	if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginInFlight {
		t.Fatalf("Begin with no monotonic time elapsed = %+v, %v; want in flight", res, err)
	}
	// A second and a half of the resume grace (Open marked resumed at 0) and
	// of the lease: both end at 1s.
	elapsed.Store(int64(1500 * time.Millisecond))
	if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginReserved || res.Epoch != held.Epoch+1 {
		t.Fatalf("Begin after the lease by the monotonic clock = %+v, %v; want taken over", res, err)
	}
}
