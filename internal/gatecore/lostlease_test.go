package gatecore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// queuedDedupe is a real Dedupe service behind a connection that, while
// down, loses the answer of every first Begin after the service reserved
// (a reservation per lost Begin) and fails every re-sent one (max_wait 0).
// Once up, the re-sent Begins of keys starting with "decoy-" hang until
// hold closes (a slow service, or a crowd ahead in line), and those of the
// key urgent pass only while urgentUp.
type queuedDedupe struct {
	idemgatev1.DedupeServiceClient
	hold chan struct{}
	mu   sync.Mutex
	down bool
	// urgentUp lets the urgent key's re-sent Begins through once up.
	urgentUp bool
	// probes counts the re-sent Begins while down; probed closes at the
	// first.
	probes int
	probed chan struct{}
	// unknowns counts OUTCOME_UNKNOWN answers to first Begins.
	unknowns int
	// earlier answers ReleaseLostBegins as a service of an earlier version,
	// so the follow-ups re-send each lost Begin.
	earlier bool
}

// ReleaseLostBegins follows the re-sent Begins' rules for the batch: while
// down it fails (counted as a probe), and once up it fails while it names
// the urgent key and that is not let through, and hangs while it names a
// decoy.
func (d *queuedDedupe) ReleaseLostBegins(ctx context.Context, req *idemgatev1.ReleaseLostBeginsRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	if d.earlier {
		return nil, unimplemented
	}
	d.mu.Lock()
	down, urgentUp := d.down, d.urgentUp
	if down {
		if d.probes++; d.probes == 1 {
			close(d.probed)
		}
	}
	d.mu.Unlock()
	if down {
		return nil, status.Error(codes.Unavailable, "the Dedupe service is unreachable")
	}
	for _, l := range req.GetLostBegins() {
		switch {
		case l.GetKey() == "urgent" && !urgentUp:
			return nil, status.Error(codes.Unavailable, "the Dedupe service is unreachable")
		case strings.HasPrefix(l.GetKey(), "decoy-"):
			select {
			case <-d.hold:
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
	}
	return d.DedupeServiceClient.ReleaseLostBegins(ctx, req, opts...)
}

func (d *queuedDedupe) Begin(ctx context.Context, req *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	resend := req.GetMaxWait().AsDuration() == 0
	d.mu.Lock()
	down, urgentUp := d.down, d.urgentUp
	if resend && down {
		if d.probes++; d.probes == 1 {
			close(d.probed)
		}
	}
	d.mu.Unlock()
	switch {
	case resend && down:
		return nil, status.Error(codes.Unavailable, "the Dedupe service is unreachable")
	case resend && strings.HasPrefix(req.GetKey(), "decoy-"):
		select {
		case <-d.hold:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	case resend && req.GetKey() == "urgent" && !urgentUp:
		return nil, status.Error(codes.Unavailable, "the Dedupe service is unreachable")
	}
	res, err := d.DedupeServiceClient.Begin(ctx, req, opts...)
	if !resend && down {
		return nil, status.Error(codes.Unavailable, "the connection broke after the reservation")
	}
	if err == nil && !resend && res.GetOutcomeUnknown() != nil {
		d.mu.Lock()
		d.unknowns++
		d.mu.Unlock()
	}
	return res, err
}

func (d *queuedDedupe) setDown(down bool) {
	d.mu.Lock()
	d.down = down
	d.mu.Unlock()
}

// loseBegins loses the Begin of key urgent (a FAIL_CLOSED lease of lease),
// then those of decoys keys with leases of an hour, all reserved.
func loseBegins(t *testing.T, e *gatecore.Engine, lease time.Duration, decoys int) (urgentSent time.Time) {
	t.Helper()
	fp := testCall("", 0).BeginRequest.GetFingerprint()
	failClosed := idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED
	urgentSent = time.Now()
	urgent := gatecore.NewCall("tool", "scope", "urgent", fp, gatecore.Policy{Lease: lease, MaxWait: time.Second, ExecutionTimeout: time.Minute, OnLostOutcome: failClosed}, time.Hour)
	if _, err := e.Begin(context.Background(), urgent); status.Code(err) != codes.Unavailable {
		t.Fatalf("urgent Begin: %v, want UNAVAILABLE", err)
	}
	long := gatecore.Policy{Lease: time.Hour, MaxWait: time.Second, ExecutionTimeout: time.Minute, OnLostOutcome: failClosed}
	for i := range decoys {
		c := gatecore.NewCall("tool", "scope", fmt.Sprintf("decoy-%d", i), fp, long, time.Hour)
		if _, err := e.Begin(context.Background(), c); status.Code(err) != codes.Unavailable {
			t.Fatalf("decoy Begin: %v, want UNAVAILABLE", err)
		}
	}
	return urgentSent
}

// A lost Begin's reservation is followed up before its lease runs out, however
// many lost Begins wait ahead of it: the one whose lease runs out first is
// re-sent first. Here the urgent key is lost first, probed (and failed) while
// the service is away, then 64 decoys with hour-long leases hang once it
// answers; a duplicate through another tool server after the urgent lease
// must find the key free, not IDEMPOTENCY_OUTCOME_UNKNOWN for a handler that
// never ran (issue 31 item 2). In line by loss, the failed probe sent the
// urgent key behind the decoys, which hold up every follow-up slot. (With a
// service of an earlier version: a current one frees the crowd in one
// ReleaseLostBegins call, TestACrowdOfLostBeginsIsFreedInAFewCalls.)
func TestALostBeginIsFollowedUpBeforeItsLeaseRunsOutBehindACrowd(t *testing.T) {
	const lease, decoys = 4 * time.Second, 64
	d := &queuedDedupe{DedupeServiceClient: embeddedDedupe(t), hold: make(chan struct{}), down: true, urgentUp: true, probed: make(chan struct{}), earlier: true}
	e := gatecore.New(d, gatecore.Options{Logger: discard(), FinishBudget: 5 * time.Minute})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = e.Close(ctx)
	})
	t.Cleanup(func() { close(d.hold) })
	urgentSent := loseBegins(t, e, lease, decoys)
	<-d.probed
	d.setDown(false)

	// A duplicate through another tool server, once the urgent lease has
	// certainly run out on the store's clock.
	time.Sleep(time.Until(urgentSent.Add(lease + time.Second)))
	other := gatecore.New(d, gatecore.Options{Logger: discard()})
	fp := testCall("", 0).BeginRequest.GetFingerprint()
	dup := gatecore.NewCall("tool", "scope", "urgent", fp, gatecore.Policy{Lease: lease, MaxWait: 100 * time.Millisecond, ExecutionTimeout: time.Minute,
		OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED}, time.Hour)
	b, err := other.Begin(context.Background(), dup)
	if err != nil || b.Kind != gatecore.Reserved {
		t.Errorf("a duplicate after the lost Begin's lease: %v, %v; want the key free (the lost reservation released by its follow-up), "+
			"never %s for a handler that never ran", b.Kind, err, idemgate.ReasonOutcomeUnknown)
	}
}

// A duplicate through the gate whose own lost Begin holds the key is not
// told IDEMPOTENCY_OUTCOME_UNKNOWN, even when that lost Begin's follow-up
// has not got through by the end of its lease: the gate knows the handler
// never ran, so the duplicate gets IDEMPOTENCY_IN_FLIGHT while the
// follow-up goes first in line, then runs once it released the key.
func TestADuplicateOfALostBeginNotYetFollowedUpIsNotToldOutcomeUnknown(t *testing.T) {
	const lease = time.Second
	d := &queuedDedupe{DedupeServiceClient: embeddedDedupe(t), hold: make(chan struct{}), down: true, probed: make(chan struct{})}
	close(d.hold)
	e := gatecore.New(d, gatecore.Options{Logger: discard(), FinishBudget: 5 * time.Minute})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = e.Close(ctx)
	})
	t.Cleanup(func() {
		d.mu.Lock()
		d.urgentUp = true
		d.mu.Unlock()
	})
	urgentSent := loseBegins(t, e, lease, 0)
	d.setDown(false) // the urgent key's re-sent Begins still fail
	time.Sleep(time.Until(urgentSent.Add(lease + time.Second)))

	fp := testCall("", 0).BeginRequest.GetFingerprint()
	policy := gatecore.Policy{Lease: lease, MaxWait: 100 * time.Millisecond, ExecutionTimeout: time.Minute, OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED}
	_, err := e.Begin(context.Background(), gatecore.NewCall("tool", "scope", "urgent", fp, policy, time.Hour))
	if grpcerr.Reason(err) != idemgate.ReasonInFlight {
		t.Fatalf("a duplicate while its gate's lost Begin is still to be followed up: %v; want %s, not %s for a handler that never ran",
			err, idemgate.ReasonInFlight, idemgate.ReasonOutcomeUnknown)
	}
	d.mu.Lock()
	d.urgentUp = true
	d.mu.Unlock()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		b, err := e.Begin(context.Background(), gatecore.NewCall("tool", "scope", "urgent", fp, policy, time.Hour))
		if err == nil && b.Kind == gatecore.Reserved {
			break
		}
		if grpcerr.Reason(err) != idemgate.ReasonInFlight || time.Now().After(deadline) {
			t.Fatalf("a retry of the duplicate: %v, %v; want IDEMPOTENCY_IN_FLIGHT until the follow-up freed the key, then Reserved", b.Kind, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
