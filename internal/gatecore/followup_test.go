package gatecore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
)

// outageDedupe is a real Dedupe service behind a connection that, while
// down, loses the answer of every Begin a caller sends (after the service
// reserved: the worst case, a reservation per lost Begin) and fails every
// re-sent one (a follow-up: max_wait 0) without reaching the service.
type outageDedupe struct {
	idemgatev1.DedupeServiceClient
	mu   sync.Mutex
	down bool
	// followUpsDown and followUpsUp count the re-sent Begins while down
	// and after.
	followUpsDown, followUpsUp int
	// probed is closed at the third re-sent Begin while down.
	probed chan struct{}
}

func (d *outageDedupe) Begin(ctx context.Context, req *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	followUp := req.GetMaxWait().AsDuration() == 0
	d.mu.Lock()
	down := d.down
	switch {
	case followUp && down:
		d.followUpsDown++
		if d.followUpsDown == 3 {
			close(d.probed)
		}
	case followUp:
		d.followUpsUp++
	}
	d.mu.Unlock()
	if followUp && down {
		return nil, status.Error(codes.Unavailable, "the Dedupe service is unreachable")
	}
	res, err := d.DedupeServiceClient.Begin(ctx, req, opts...)
	if err == nil && down {
		return nil, status.Error(codes.Unavailable, "the connection broke after the reservation")
	}
	return res, err
}

// maxProbes is how many re-sent Begins a bounded follow-up can send in an
// outage of w: one at a time, the k-th after k sleeps of at least half the
// backoff, which starts at lo and doubles up to hi.
func maxProbes(w, lo, hi time.Duration) int {
	n, slept := 0, time.Duration(0)
	for b := lo; ; b = min(2*b, hi) {
		if slept += b / 2; slept > w {
			return n
		}
		n++
	}
}

// During an outage the follow-ups of many lost Begins cost O(1) re-sent
// Begins per backoff interval, not one per lost Begin, and once the service
// answers again every reservation a lost Begin made is released.
func TestLostBeginFollowUpsAreBoundedDuringAnOutage(t *testing.T) {
	const callers, callsEach = 10, 10
	d := &outageDedupe{DedupeServiceClient: embeddedDedupe(t), down: true, probed: make(chan struct{})}
	e := gatecore.New(d, gatecore.Options{Logger: discard(), FinishBudget: 5 * time.Minute})
	policy := gatecore.Policy{Lease: 10 * time.Minute, MaxWait: time.Second, ExecutionTimeout: time.Minute}
	fp := testCall("", 0).BeginRequest.GetFingerprint()
	key := func(i, j int) string { return fmt.Sprintf("outage-%d-%d", i, j) }

	start := time.Now()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for j := range callsEach {
				c := gatecore.NewCall("tool", "scope", key(i, j), fp, policy, time.Hour)
				if _, err := e.Begin(context.Background(), c); status.Code(err) != codes.Unavailable {
					t.Errorf("Begin during the outage: %v, want UNAVAILABLE", err)
				}
			}
		})
	}
	wg.Wait()
	<-d.probed // the outage lasts at least three follow-ups
	d.mu.Lock()
	d.down = false
	outage, sent := time.Since(start), d.followUpsDown
	d.mu.Unlock()
	bound := maxProbes(outage, gatecore.FollowUpMinBackoff, gatecore.FollowUpMaxBackoff)
	t.Logf("%d lost Begins: %d re-sent during an outage of %v (at most %d)", callers*callsEach, sent, outage, bound)
	if sent > bound {
		t.Errorf("%d lost Begins made the follow-ups re-send %d Begins during an outage of %v; want at most %d, one at a time on a shared backoff",
			callers*callsEach, sent, outage, bound)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if up := d.followUpsUp; up > callers*callsEach {
		t.Errorf("%d Begins re-sent after the outage for %d lost ones, want at most one each", up, callers*callsEach)
	}
	check := gatecore.New(d, gatecore.Options{Logger: discard()})
	for i := range callers {
		for j := range callsEach {
			c := gatecore.NewCall("tool", "scope", key(i, j), fp, gatecore.Policy{Lease: time.Minute, ExecutionTimeout: time.Minute}, time.Hour)
			if b, err := check.Begin(context.Background(), c); err != nil || b.Kind != gatecore.Reserved {
				t.Errorf("key %s after the follow-ups: %v, %v; want it free (its lost reservation released)", key(i, j), b.Kind, err)
			}
		}
	}
	if s := e.Stats(); s.LostBegins != callers*callsEach || s.ReleaseFailures != 0 {
		t.Errorf("Stats = %+v, want %d lost Begins and no release failure", s, callers*callsEach)
	}
}

// The lost Begins of one attempt (a call that Begins again with the same
// token, as a reconciling one does) are followed up as one: one Begin is
// re-sent for them once the service answers, and the key is freed.
func TestLostBeginsOfOneAttemptAreFollowedUpOnce(t *testing.T) {
	d := &outageDedupe{DedupeServiceClient: embeddedDedupe(t), down: true, probed: make(chan struct{})}
	e := gatecore.New(d, gatecore.Options{Logger: discard()})
	c := testCall("lost-thrice", time.Hour)
	c.BeginRequest.MaxWait = durationpb.New(time.Second)
	for range 3 {
		if _, err := e.Begin(context.Background(), c); status.Code(err) != codes.Unavailable {
			t.Fatalf("Begin during the outage: %v, want UNAVAILABLE", err)
		}
	}
	<-d.probed
	d.mu.Lock()
	d.down = false
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d.followUpsUp != 1 {
		t.Errorf("%d Begins re-sent after the outage for one attempt's three lost ones, want 1", d.followUpsUp)
	}
	if b, err := gatecore.New(d, gatecore.Options{Logger: discard()}).Begin(context.Background(), testCall("lost-thrice", time.Hour)); err != nil || b.Kind != gatecore.Reserved {
		t.Errorf("the key after the follow-up: %v, %v; want it free", b.Kind, err)
	}
}
