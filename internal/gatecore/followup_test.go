package gatecore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
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

// ReleaseLostBegins is a follow-up: while down it fails without reaching
// the service, and it is counted as the re-sent Begins are.
func (d *outageDedupe) ReleaseLostBegins(ctx context.Context, req *idemgatev1.ReleaseLostBeginsRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	d.mu.Lock()
	down := d.down
	if down {
		d.followUpsDown++
		if d.followUpsDown == 3 {
			close(d.probed)
		}
	} else {
		d.followUpsUp++
	}
	d.mu.Unlock()
	if down {
		return nil, status.Error(codes.Unavailable, "the Dedupe service is unreachable")
	}
	return d.DedupeServiceClient.ReleaseLostBegins(ctx, req, opts...)
}

// unimplemented is what a Dedupe service of an earlier version answers
// ReleaseLostBegins.
var unimplemented = status.Error(codes.Unimplemented, "unknown method ReleaseLostBegins for service idemgate.v1.DedupeService")

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

// crowdDedupe is a real Dedupe service behind a connection that loses the
// answer of every first Begin (max_wait above zero): a decoy's before it
// reaches the service (a caller that gave up before it reserved), the real
// one's after the service reserved. Re-sent decoys (max_wait 0) are
// answered slowly, as by an overloaded service.
type crowdDedupe struct {
	idemgatev1.DedupeServiceClient
	slow time.Duration
	mu   sync.Mutex
	// realResent counts the re-sent Begins of the real one.
	realResent int
}

// ReleaseLostBegins answers as a service of an earlier version: the
// follow-ups re-send each lost Begin.
func (d *crowdDedupe) ReleaseLostBegins(context.Context, *idemgatev1.ReleaseLostBeginsRequest, ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	return nil, unimplemented
}

func (d *crowdDedupe) Begin(ctx context.Context, req *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	decoy := strings.HasPrefix(req.GetKey(), "decoy-")
	if req.GetMaxWait().AsDuration() > 0 {
		if !decoy {
			if _, err := d.DedupeServiceClient.Begin(ctx, req, opts...); err != nil {
				return nil, err
			}
		}
		return nil, status.Error(codes.DeadlineExceeded, "the caller gave up")
	}
	if decoy {
		if !sleepCtx(ctx, d.slow) {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	} else {
		d.mu.Lock()
		d.realResent++
		d.mu.Unlock()
	}
	return d.DedupeServiceClient.Begin(ctx, req, opts...)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// A crowd of lost Begins whose re-sends a slow service answers one by one
// must not starve the one lost Begin that did reserve: once the service
// answers, follow-ups are re-sent several at a time, so the real one is
// released within its budget (one at a time it would come up only after
// decoys × slow = 32s, over twice its budget; 64 at a time after about
// one slow answer).
func TestLostBeginFollowUpsDrainConcurrentlyOnceTheServiceAnswers(t *testing.T) {
	const decoys, slow, budget = 64, 500 * time.Millisecond, 12 * time.Second
	d := &crowdDedupe{DedupeServiceClient: embeddedDedupe(t), slow: slow}
	e := gatecore.New(d, gatecore.Options{Logger: discard(), FinishBudget: budget})
	policy := gatecore.Policy{Lease: 10 * time.Minute, MaxWait: time.Second, ExecutionTimeout: time.Minute}
	fp := testCall("", 0).BeginRequest.GetFingerprint()
	for i := range decoys {
		c := gatecore.NewCall("tool", "scope", fmt.Sprintf("decoy-%d", i), fp, policy, time.Hour)
		if _, err := e.Begin(context.Background(), c); status.Code(err) != codes.Unavailable {
			t.Fatalf("decoy Begin: %v, want UNAVAILABLE", err)
		}
	}
	real := gatecore.NewCall("tool", "scope", "real", fp, policy, time.Hour)
	if _, err := e.Begin(context.Background(), real); status.Code(err) != codes.Unavailable {
		t.Fatalf("real Begin: %v, want UNAVAILABLE", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d.realResent != 1 {
		t.Errorf("the real lost Begin was re-sent %d times, want once, within its budget, behind %d slow decoys", d.realResent, decoys)
	}
	c := gatecore.NewCall("tool", "scope", "real", fp, gatecore.Policy{Lease: time.Minute, ExecutionTimeout: time.Minute}, time.Hour)
	if b, err := gatecore.New(d, gatecore.Options{Logger: discard()}).Begin(context.Background(), c); err != nil || b.Kind != gatecore.Reserved {
		t.Errorf("the real key after the follow-ups: %v, %v; want it free (its lost reservation released)", b.Kind, err)
	}
	if s := e.Stats(); s.LostBegins != decoys+1 || s.ReleaseFailures != 0 {
		t.Errorf("Stats = %+v, want %d lost Begins and no release failure", s, decoys+1)
	}
}

// againDedupe stages a second lost Begin of one attempt that reaches the
// service only after the follow-up of the first released the reservation.
type againDedupe struct {
	idemgatev1.DedupeServiceClient
	mu              sync.Mutex
	begins, resends int
	resent1         chan struct{} // the first re-sent Begin is on its way
	lost2, released chan struct{} // the second Begin was lost; the follow-up released
	forwarded2      chan struct{} // the second Begin reached the service
	releaseOnce     sync.Once
}

// ReleaseLostBegins answers as a service of an earlier version: the
// follow-ups re-send each lost Begin.
func (d *againDedupe) ReleaseLostBegins(context.Context, *idemgatev1.ReleaseLostBeginsRequest, ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	return nil, unimplemented
}

func (d *againDedupe) Begin(ctx context.Context, req *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	d.mu.Lock()
	resend := req.GetMaxWait().AsDuration() == 0
	if resend {
		d.resends++
	} else {
		d.begins++
	}
	begins, resends := d.begins, d.resends
	d.mu.Unlock()
	switch {
	case !resend && begins == 1:
		return nil, status.Error(codes.Unavailable, "lost before it reached the service")
	case !resend:
		// Still on its way when the caller gave up: it lands after the
		// follow-up's Release.
		go func() {
			<-d.released
			_, _ = d.DedupeServiceClient.Begin(context.WithoutCancel(ctx), req, opts...)
			close(d.forwarded2)
		}()
		return nil, status.Error(codes.DeadlineExceeded, "the caller gave up")
	case resends == 1:
		close(d.resent1)
		<-d.lost2 // the second Begin is lost while this one is in flight
	default:
		<-d.forwarded2
	}
	return d.DedupeServiceClient.Begin(ctx, req, opts...)
}

func (d *againDedupe) Release(ctx context.Context, req *idemgatev1.ReleaseRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	res, err := d.DedupeServiceClient.Release(ctx, req, opts...)
	if err == nil {
		d.releaseOnce.Do(func() { close(d.released) })
	}
	return res, err
}

// A Begin of an attempt lost again while its follow-up's re-sent Begin is
// in flight may reach the service after that follow-up released: it is
// followed up once more, so its reservation does not outlive the call.
func TestABeginLostAgainWhileItsFollowUpIsInFlightIsFollowedUpAgain(t *testing.T) {
	d := &againDedupe{DedupeServiceClient: embeddedDedupe(t), resent1: make(chan struct{}), lost2: make(chan struct{}), released: make(chan struct{}), forwarded2: make(chan struct{})}
	e := gatecore.New(d, gatecore.Options{Logger: discard()})
	c := testCall("lost-again", time.Hour)
	c.BeginRequest.MaxWait = durationpb.New(time.Second)
	for i := range 2 {
		if i == 1 {
			<-d.resent1
		}
		if _, err := e.Begin(context.Background(), c); status.Code(err) != codes.Unavailable {
			t.Fatalf("Begin: %v, want UNAVAILABLE", err)
		}
	}
	close(d.lost2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-d.forwarded2:
	case <-ctx.Done():
		t.Fatal("the second Begin never reached the service")
	}
	if b, err := gatecore.New(d, gatecore.Options{Logger: discard()}).Begin(context.Background(), testCall("lost-again", time.Hour)); err != nil || b.Kind != gatecore.Reserved {
		t.Errorf("the key after the follow-ups: %v, %v; want it free (the late Begin's reservation released)", b.Kind, err)
	}
}

// A Begin lost once Close began is logged, not followed up, even while
// the follow-ups of earlier ones still run: Close must not wait for a
// budget that starts after it began.
func TestABeginLostAfterCloseBeganIsNotFollowedUp(t *testing.T) {
	d := &outageDedupe{DedupeServiceClient: embeddedDedupe(t), down: true, probed: make(chan struct{})}
	e := gatecore.New(d, gatecore.Options{Logger: discard()})
	begin := func(key string) {
		c := testCall(key, time.Hour)
		c.BeginRequest.MaxWait = durationpb.New(time.Second)
		if _, err := e.Begin(context.Background(), c); status.Code(err) != codes.Unavailable {
			t.Fatalf("Begin during the outage: %v, want UNAVAILABLE", err)
		}
	}
	begin("lost-before-close")
	closed := make(chan error)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		closed <- e.Close(ctx)
	}()
	for !e.Closing() {
		time.Sleep(time.Millisecond)
	}
	begin("lost-after-close")
	d.mu.Lock()
	d.down = false
	d.mu.Unlock()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d.followUpsUp != 1 {
		t.Errorf("%d Begins re-sent after the outage, want 1: the one lost before Close began", d.followUpsUp)
	}
}

// stuckReleaseDedupe answers the re-sent Begin once its follow-up's budget
// ran out, and never takes a Release.
type stuckReleaseDedupe struct {
	idemgatev1.DedupeServiceClient
	lostAt time.Time
	budget time.Duration
}

// ReleaseLostBegins answers as a service of an earlier version: the
// follow-ups re-send each lost Begin.
func (d *stuckReleaseDedupe) ReleaseLostBegins(context.Context, *idemgatev1.ReleaseLostBeginsRequest, ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	return nil, unimplemented
}

func (d *stuckReleaseDedupe) Begin(ctx context.Context, req *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	res, err := d.DedupeServiceClient.Begin(ctx, req, opts...)
	if req.GetMaxWait().AsDuration() > 0 {
		return nil, status.Error(codes.Unavailable, "the connection broke after the reservation")
	}
	if !sleepCtx(ctx, time.Until(d.lostAt.Add(d.budget+2*time.Second))) {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return res, err
}

func (d *stuckReleaseDedupe) Release(context.Context, *idemgatev1.ReleaseRequest, ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	return nil, status.Error(codes.Unavailable, "the Dedupe service is overloaded")
}

// A follow-up's Release is retried within the follow-up's budget, not a
// fresh one: Close waits for at most one budget per lost Begin.
func TestALostBeginsReleaseIsRetriedWithinItsFollowUpsBudget(t *testing.T) {
	const budget = 5 * time.Second
	d := &stuckReleaseDedupe{DedupeServiceClient: embeddedDedupe(t), budget: budget}
	e := gatecore.New(d, gatecore.Options{Logger: discard(), FinishBudget: budget, DedupeTimeout: 4 * budget})
	c := testCall("stuck-release", time.Hour)
	c.BeginRequest.MaxWait = durationpb.New(time.Second)
	d.lostAt = time.Now() // before the loss, so the follow-up's budget ends no earlier
	if _, err := e.Begin(context.Background(), c); status.Code(err) != codes.Unavailable {
		t.Fatalf("Begin: %v, want UNAVAILABLE", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if s := e.Stats(); s.ReleaseRetries != 0 || s.ReleaseFailures != 1 {
		t.Errorf("Stats = %+v, want the Release tried once and given up (its follow-up's budget had run out), not retried", s)
	}
}

// lostAnswersDedupe is a real Dedupe service behind a connection that loses
// the answer of every first Begin (max_wait above zero) after the service
// reserved, and, while down, every ReleaseLostBegins before it reaches the
// service; it counts the follow-ups' calls once up.
type lostAnswersDedupe struct {
	idemgatev1.DedupeServiceClient
	mu                           sync.Mutex
	down                         bool
	resent, releases, batches    int
	largestBatch, namedInBatches int
}

func (d *lostAnswersDedupe) Begin(ctx context.Context, req *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	if req.GetMaxWait().AsDuration() == 0 {
		d.mu.Lock()
		d.resent++
		d.mu.Unlock()
		return d.DedupeServiceClient.Begin(ctx, req, opts...)
	}
	if _, err := d.DedupeServiceClient.Begin(ctx, req, opts...); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.Unavailable, "the connection broke after the reservation")
}

func (d *lostAnswersDedupe) Release(ctx context.Context, req *idemgatev1.ReleaseRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	d.mu.Lock()
	d.releases++
	d.mu.Unlock()
	return d.DedupeServiceClient.Release(ctx, req, opts...)
}

func (d *lostAnswersDedupe) ReleaseLostBegins(ctx context.Context, req *idemgatev1.ReleaseLostBeginsRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	d.mu.Lock()
	down := d.down
	if !down {
		d.batches++
		d.largestBatch = max(d.largestBatch, len(req.GetLostBegins()))
		d.namedInBatches += len(req.GetLostBegins())
	}
	d.mu.Unlock()
	if down {
		return nil, status.Error(codes.Unavailable, "the Dedupe service is unreachable")
	}
	return d.DedupeServiceClient.ReleaseLostBegins(ctx, req, opts...)
}

// A crowd of 2,048 lost Begins waiting when the service answers again is
// freed in a few calls, each a batch the store writes in one round trip,
// not a re-sent Begin and a Release per lost Begin at a capped rate: what following a crowd up costs, and so how long
// it takes, barely grows with the crowd, where one by one it took
// crowd / 250 seconds and a crowd of 480 in a 3s lease was found
// outcome-unknown by duplicates (issue 38).
func TestACrowdOfLostBeginsIsFreedInAFewCalls(t *testing.T) {
	const crowd, callers = 2048, 8
	d := &lostAnswersDedupe{DedupeServiceClient: embeddedDedupe(t), down: true}
	e := gatecore.New(d, gatecore.Options{Logger: discard(), FinishBudget: 5 * time.Minute})
	policy := gatecore.Policy{Lease: 10 * time.Minute, MaxWait: time.Second, ExecutionTimeout: time.Minute}
	fp := testCall("", 0).BeginRequest.GetFingerprint()
	key := func(i int) string { return fmt.Sprintf("crowd-%04d", i) }
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := c; i < crowd; i += callers {
				call := gatecore.NewCall("tool", "scope", key(i), fp, policy, time.Hour)
				if _, err := e.Begin(context.Background(), call); status.Code(err) != codes.Unavailable {
					t.Errorf("Begin of %s with its answer lost: %v, want UNAVAILABLE", key(i), err)
				}
			}
		})
	}
	wg.Wait()
	d.mu.Lock()
	d.down = false
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Each batch full but the last, and one more for a batch in flight
	// when the service came back.
	most := (crowd+gatecore.FollowUpBatch-1)/gatecore.FollowUpBatch + 1
	t.Logf("%d lost Begins: %d ReleaseLostBegins calls (largest %d), %d re-sent Begins, %d Releases", crowd, d.batches, d.largestBatch, d.resent, d.releases)
	if d.resent != 0 || d.releases != 0 || d.batches > most || d.namedInBatches < crowd {
		t.Errorf("%d lost Begins were followed up with %d re-sent Begins, %d Releases and %d ReleaseLostBegins calls naming %d attempts; want no Begin or Release, at most %d calls, every attempt named",
			crowd, d.resent, d.releases, d.batches, d.namedInBatches, most)
	}
	check := gatecore.New(d, gatecore.Options{Logger: discard()})
	for i := range crowd {
		c := gatecore.NewCall("tool", "scope", key(i), fp, gatecore.Policy{Lease: time.Minute, ExecutionTimeout: time.Minute}, time.Hour)
		if b, err := check.Begin(context.Background(), c); err != nil || b.Kind != gatecore.Reserved {
			t.Fatalf("key %s after the follow-ups: %v, %v; want it free (its lost reservation released)", key(i), b.Kind, err)
		}
	}
	if s := e.Stats(); s.LostBegins != crowd {
		t.Errorf("Stats().LostBegins = %d, want %d", s.LostBegins, crowd)
	}
}

// beginFailingStore is a real store whose Begin fails with err.
type beginFailingStore struct {
	dedupesvc.Store
	err error
}

func (s beginFailingStore) Begin(context.Context, dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	return dedupesvc.BeginResult{}, s.err
}

// A Begin the Dedupe service answers as having reserved nothing (its store
// failed before sending any of it) is not followed up: a store outage that
// refuses every try must not fill the follow-ups' queue with them, which
// crowded out lost Begins that had reserved (issue 38 item 2). One whose
// store may have sent it is followed up as before.
func TestABeginThatReservedNothingIsNotFollowedUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		lost int64
	}{
		{"not sent", dedupesvc.NotSent(errors.New("connect: connection refused")), 0},
		{"maybe sent", errors.New("unexpected EOF"), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := sqlitestore.Open(context.Background(), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			srv := dedupesvc.NewServer(beginFailingStore{store, tc.err}, dedupesvc.WithLogger(discard()))
			d := &lostAnswersDedupe{DedupeServiceClient: dedupesvc.NewInProcessClient(srv)}
			e := gatecore.New(d, gatecore.Options{Logger: discard()})
			c := testCall("refused", time.Hour)
			if _, err := e.Begin(context.Background(), c); status.Code(err) != codes.Unavailable || grpcerr.Reason(err) != idemgate.ReasonStoreUnavailable {
				t.Fatalf("Begin = %v, want UNAVAILABLE %s", err, idemgate.ReasonStoreUnavailable)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := e.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if s := e.Stats(); s.LostBegins != tc.lost {
				t.Errorf("Stats().LostBegins = %d, want %d", s.LostBegins, tc.lost)
			}
			if tc.lost == 0 && d.batches != 0 {
				t.Errorf("%d ReleaseLostBegins calls for a Begin that reserved nothing, want none", d.batches)
			}
		})
	}
}
