//go:build faults

// The real-process tests build cmd/dedupesvc (a second, non-race compile of
// every dependency) and start real processes and PostgreSQL clusters: they
// run in `make faults`, which CI runs, not in `make test`.

package main_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// Load of the failover test: workers each reserve keysPerWorker keys, one
// after the other, and finish every other one. killAfter acknowledged calls
// in, the primary dies.
const (
	workers       = 4
	keysPerWorker = 100
	killAfter     = 40
	// shortLease is the lease of the reservation that would run out during
	// the failover if the store did not count the outage in the holder's
	// favour. Long enough for the check right after recovery to run within
	// it on a loaded machine; the outage is held longer than it.
	shortLease = 15 * time.Second
)

// failoverLedger is what the service acknowledged during the failover test.
type failoverLedger struct {
	mu sync.Mutex
	// reserved holds each key whose Begin answered reserved.
	reserved map[string]bool
	// sent holds the outcome of each Finish sent, acknowledged or not;
	// finished the ones acknowledged.
	sent, finished map[string]*anypb.Any
	// failures counts the failed calls by code, unexpected the ones of other
	// codes than the outage's UNAVAILABLE (and DEADLINE_EXCEEDED, which a
	// loaded machine may give).
	failures   map[codes.Code]int
	unexpected []string
	acked      atomic.Int64
}

func (l *failoverLedger) failed(what string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	code := status.Code(err)
	l.failures[code]++
	if code != codes.Unavailable && code != codes.DeadlineExceeded {
		l.unexpected = append(l.unexpected, fmt.Sprintf("%s: %v", what, err))
	}
}

func leasedBegin(client idemgatev1.DedupeServiceClient, key, attempt string, lease time.Duration, policy idemgatev1.LostOutcomePolicy) (*idemgatev1.BeginResponse, error) {
	req := beginRequest(key, attempt)
	req.Lease, req.OnLostOutcome = durationpb.New(lease), policy
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return client.Begin(ctx, req, grpc.WaitForReady(true))
}

func finish(client idemgatev1.DedupeServiceClient, key, attempt string, epoch int64, outcome *anypb.Any) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err := client.Finish(ctx, &idemgatev1.FinishRequest{
		Scope: beginRequest(key, attempt).Scope, Key: key, AttemptToken: attempt, Epoch: epoch, Outcome: outcome,
	}, grpc.WaitForReady(true))
	return err
}

// runWorker reserves its keys in turn, retrying each Begin and Finish with
// the same attempt until the service acknowledges it (a retried Begin of the
// same attempt answers reserved again), and records what was acknowledged.
func runWorker(client idemgatev1.DedupeServiceClient, w int, l *failoverLedger, stop <-chan struct{}) {
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for n := range keysPerWorker {
		key := fmt.Sprintf("load-%d-%d", w, n)
		attempt := "attempt-" + key
		var epoch int64
		for epoch == 0 {
			if stopped() {
				return
			}
			resp, err := leasedBegin(client, key, attempt, time.Hour, idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED)
			switch {
			case err != nil:
				l.failed("Begin "+key, err)
				time.Sleep(20 * time.Millisecond)
			case resp.GetReserved() == nil:
				l.failed("Begin "+key, fmt.Errorf("answered %v; want reserved", resp))
				return
			default:
				epoch = resp.GetReserved().GetEpoch()
				l.mu.Lock()
				l.reserved[key] = true
				l.mu.Unlock()
				l.acked.Add(1)
			}
		}
		if n%2 == 1 {
			continue // left in flight
		}
		outcome := &anypb.Any{TypeUrl: "type.googleapis.com/test.Charge", Value: []byte("charged " + key)}
		l.mu.Lock()
		l.sent[key] = outcome
		l.mu.Unlock()
		for {
			if stopped() {
				return
			}
			err := finish(client, key, attempt, epoch, outcome)
			if err == nil {
				l.mu.Lock()
				l.finished[key] = outcome
				l.mu.Unlock()
				l.acked.Add(1)
				break
			}
			l.failed("Finish "+key, err)
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// PostgreSQL fails over under load: the primary, whose synchronous standby has
// every commit it acknowledged, is killed mid-load and the standby promoted.
// The service, on a multi-host URL with target_session_attrs=read-write,
// recovers by itself, and nothing it acknowledged is lost: every reservation
// is still held and every stored outcome replays byte for byte. A reservation
// whose lease ran out during the outage is not taken over right after
// recovery: the store counts the outage in its holder's favour.
func TestAcknowledgedRecordsSurvivePostgresFailover(t *testing.T) {
	t.Parallel()
	setupStart := time.Now()
	cluster := pgtest.NewReplicatedCluster(t)
	t.Logf("replicated cluster (%s) ready in %s", cluster, time.Since(setupStart).Round(time.Millisecond))
	bin := proctest.Build(t, dedupesvcPkg)
	addr := stacktest.FreeAddr(t)
	svc := proctest.Start(t, bin, []string{"-listen", addr, "-database-url", cluster.URL("postgres"), "-metrics-listen="}, nil)
	svc.WaitTCP(t, addr, recoverTimeout)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := idemgatev1.NewDedupeServiceClient(conn)

	// A holder that will not be able to renew: its lease would end during
	// the outage.
	const reexecute = idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE
	if resp, err := leasedBegin(client, "lapsing", "holder", shortLease, reexecute); err != nil || resp.GetReserved() == nil {
		t.Fatalf("Begin lapsing = %v, %v; want reserved", resp, err)
	}
	lapsingReserved := time.Now()

	l := &failoverLedger{reserved: map[string]bool{}, sent: map[string]*anypb.Any{}, finished: map[string]*anypb.Any{}, failures: map[codes.Code]int{}}
	stop := make(chan struct{})
	var load sync.WaitGroup
	t.Cleanup(func() { close(stop); load.Wait() }) // on an early Fatal
	for w := range workers {
		load.Go(func() { runWorker(client, w, l, stop) })
	}
	for l.acked.Load() < killAfter {
		time.Sleep(10 * time.Millisecond)
	}

	cluster.KillPrimary(t)
	killed := time.Now()
	ackedAtKill := l.acked.Load()
	// Hold the outage past the lapsing lease, so only the store's resume
	// mark can keep it.
	time.Sleep(time.Until(lapsingReserved.Add(shortLease + time.Second)))
	ackedInOutage := l.acked.Load()
	promoting := time.Now()
	cluster.Promote(t)
	promoted := time.Now()

	// The service recovers by itself: no restart.
	deadline := time.Now().Add(recoverTimeout)
	for {
		resp, err := begin(client, "probe", "attempt-probe")
		if err == nil && resp.GetReserved() != nil {
			break
		}
		if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("Begin after promotion = %v, %v; want reserved (retrying UNAVAILABLE for %s)", resp, err, recoverTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	recovered := time.Now()
	if resp, err := leasedBegin(client, "lapsing", "taker", shortLease, reexecute); err != nil || resp.GetInFlight() == nil {
		t.Errorf("Begin lapsing by another attempt right after recovery (%s after its reservation, lease %s) = %v, %v; want in_flight",
			time.Since(lapsingReserved).Round(time.Millisecond), shortLease, resp, err)
	}
	t.Logf("outage: primary killed, standby promoted %s later (held past the %s lease; Promote took %s); service recovered %s after Promote returned, %s after the kill",
		promoted.Sub(killed).Round(time.Millisecond), shortLease, promoted.Sub(promoting).Round(time.Millisecond),
		recovered.Sub(promoted).Round(time.Millisecond), recovered.Sub(killed).Round(time.Millisecond))

	load.Wait() // the workers run out of keys
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("load: %d reservations and %d outcomes acknowledged (%d calls by the kill's end, %d more before the promotion), failed calls by code: %v",
		len(l.reserved), len(l.finished), ackedAtKill, ackedInOutage-ackedAtKill, l.failures)
	for _, u := range l.unexpected {
		t.Errorf("unexpected failure under failover: %s", u)
	}
	if len(l.reserved) != workers*keysPerWorker {
		t.Errorf("%d reservations acknowledged; want all %d", len(l.reserved), workers*keysPerWorker)
	}

	// Nothing acknowledged is lost. Another attempt finds each reservation
	// held, or completed: with exactly the outcome acknowledged, or, where a
	// Finish was sent but its answer lost, with exactly the one sent.
	keys := make([]string, 0, len(l.reserved))
	for k := range l.reserved {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		resp, err := begin(client, key, "verifier")
		if err != nil {
			t.Fatalf("Begin %s by another attempt after the failover: %v", key, err)
		}
		want, acknowledged := l.finished[key]
		if !acknowledged {
			want = l.sent[key]
		}
		switch got := resp.GetCompleted().GetOutcome(); {
		case acknowledged && (got == nil || !proto.Equal(got, want)):
			t.Errorf("Begin %s after the failover = %v; want completed with the acknowledged outcome %v", key, resp, want)
		case !acknowledged && resp.GetInFlight() == nil && (want == nil || got == nil || !proto.Equal(got, want)):
			t.Errorf("Begin %s after the failover = %v; want in_flight (its reservation was acknowledged)", key, resp)
		}
	}
}
