//go:build faults

// The real-process tests build cmd/dedupesvc (a second, non-race compile of
// every dependency) and start real processes and PostgreSQL clusters: they
// run in `make faults`, which CI runs, not in `make test`.

package main_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// callTimeout bounds one RPC; recoverTimeout bounds how long the service may
// take to come back by itself. Both generous: the machine is shared.
const (
	callTimeout    = time.Minute
	recoverTimeout = 3 * time.Minute
)

func beginRequest(key, attempt string) *idemgatev1.BeginRequest {
	fp := sha256.Sum256([]byte("charge " + key))
	return &idemgatev1.BeginRequest{
		Scope:         "/payments.v1.PaymentsService/ChargeCard",
		Key:           key,
		Fingerprint:   fp[:],
		AttemptToken:  attempt,
		Lease:         durationpb.New(time.Hour), // outlives the test: in_flight below is the lease, not luck
		Retention:     durationpb.New(24 * time.Hour),
		OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED,
	}
}

func begin(client idemgatev1.DedupeServiceClient, key, attempt string) (*idemgatev1.BeginResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// WaitForReady rides over the reconnect to a restarted service.
	return client.Begin(ctx, beginRequest(key, attempt), grpc.WaitForReady(true))
}

// The shape of a fault test on real processes: the dedupesvc binary on a
// throwaway PostgreSQL cluster, the service SIGKILLed and restarted, the
// database crashed and restarted.
func TestReservationSurvivesServiceKillAndServiceRecoversFromDatabaseCrash(t *testing.T) {
	t.Parallel()
	cluster := pgtest.NewCluster(t)
	bin := proctest.Build(t, dedupesvcPkg)
	addr := stacktest.FreeAddr(t)
	args := []string{"-listen", addr, "-database-url", cluster.URL("postgres"), "-metrics-listen="}
	svc := proctest.Start(t, bin, args, nil)
	svc.WaitTCP(t, addr, recoverTimeout)

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := idemgatev1.NewDedupeServiceClient(conn)

	if resp, err := begin(client, "order-1", "attempt-a"); err != nil || resp.GetReserved() == nil {
		t.Fatalf("Begin order-1 = %v, %v; want reserved", resp, err)
	}

	// SIGKILL: no graceful stop, no release. The reservation is the
	// database's, so a new process on the same address still honours it.
	svc.Kill()
	proctest.Start(t, bin, args, nil).WaitTCP(t, addr, recoverTimeout)
	if resp, err := begin(client, "order-1", "attempt-b"); err != nil || resp.GetInFlight() == nil {
		t.Fatalf("Begin order-1 by another attempt after the kill = %v, %v; want in_flight", resp, err)
	}

	// A database crash: the service answers UNAVAILABLE, which callers retry,
	// rather than guessing.
	cluster.Stop(t, "immediate")
	_, err = begin(client, "order-2", "attempt-a")
	if status.Code(err) != codes.Unavailable || grpcerr.Reason(err) != dedupesvc.ReasonStoreUnavailable {
		t.Fatalf("Begin with the database down = %v; want UNAVAILABLE, %s", err, dedupesvc.ReasonStoreUnavailable)
	}

	// Once the database is back the service recovers by itself: no restart.
	// The same attempt retries, so a Begin that reserved but whose answer was
	// lost comes back reserved too.
	cluster.Start(t)
	deadline := time.Now().Add(recoverTimeout)
	for {
		resp, err := begin(client, "order-2", "attempt-a")
		if err == nil && resp.GetReserved() != nil {
			break
		}
		if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("Begin after the database restarted = %v, %v; want reserved (retrying UNAVAILABLE for %s)", resp, err, recoverTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if resp, err := begin(client, "order-1", "attempt-c"); err != nil || resp.GetInFlight() == nil {
		t.Fatalf("Begin order-1 after the database crash = %v, %v; want still in_flight", resp, err)
	}
}
