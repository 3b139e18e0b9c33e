package storetest

import (
	"bytes"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// finishReq is a FinishRequest of key's holder token at epoch with value.
func finishReq(key, token string, epoch int64, value []byte) *idemgatev1.FinishRequest {
	return &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: key, AttemptToken: token, Epoch: epoch,
		Outcome: &anypb.Any{TypeUrl: outA.TypeURL, Value: value}}
}

// testFinishQuota checks the bytes quota at Finish: reserving under the
// quota and then finishing large outcomes must not store past it. An
// outcome that would take the caller over its quota is replaced by the
// ResultTooLarge marker: the holder's Finish succeeds (its handler ran, its
// caller has its response) and every duplicate replays the marker, so
// nothing runs twice and the bytes are not stored.
func testFinishQuota(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	s := newStore(t)
	metrics := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(s, dedupesvc.WithCallerQuota(0, 1000), dedupesvc.WithMetrics(metrics))
	// Both reservations are under the quota: nothing is stored yet.
	epochs := map[string]int64{}
	for _, key := range []string{"k1", "k2"} {
		begun, err := srv.Begin(as("greedy"), beginReq("/pkg.S/M", key, "t1"))
		if err != nil || begun.GetReserved() == nil {
			t.Fatalf("Begin %s = %v, %v; want reserved", key, begun, err)
		}
		epochs[key] = begun.GetReserved().GetEpoch()
	}
	fits := bytes.Repeat([]byte("a"), 800)
	if _, err := srv.Finish(as("greedy"), finishReq("k1", "t1", epochs["k1"], fits)); err != nil {
		t.Fatalf("Finish within the quota: %v", err)
	}
	settleUsage(t, s)
	over := bytes.Repeat([]byte("b"), 800)
	if _, err := srv.Finish(as("greedy"), finishReq("k2", "t1", epochs["k2"], over)); err != nil {
		t.Fatalf("Finish past the quota = %v; want OK (the handler ran: a marker is stored in its place)", err)
	}
	// A retry of that Finish is a retry, not a second store.
	if _, err := srv.Finish(as("greedy"), finishReq("k2", "t1", epochs["k2"], over)); err != nil {
		t.Fatalf("retried Finish past the quota: %v", err)
	}
	dup, err := srv.Begin(as("greedy"), beginReq("/pkg.S/M", "k1", "t2"))
	if err != nil || !bytes.Equal(dup.GetCompleted().GetOutcome().GetValue(), fits) {
		t.Fatalf("duplicate of the outcome that fitted = %v, %v; want it replayed", dup, err)
	}
	dup, err = srv.Begin(as("greedy"), beginReq("/pkg.S/M", "k2", "t2"))
	if err != nil || dup.GetCompleted() == nil {
		t.Fatalf("duplicate of the outcome past the quota = %v, %v; want completed with the marker", dup, err)
	}
	marker := &idemgatev1.ResultTooLarge{}
	if err := dup.GetCompleted().GetOutcome().UnmarshalTo(marker); err != nil {
		t.Fatalf("the outcome past the quota replays as %q (%d bytes); want the ResultTooLarge marker: %v",
			dup.GetCompleted().GetOutcome().GetTypeUrl(), len(dup.GetCompleted().GetOutcome().GetValue()), err)
	}
	if marker.GetSizeBytes() != int64(len(over)) || marker.GetTypeUrl() != outA.TypeURL {
		t.Fatalf("marker %v; want the size %d and type %s of the outcome it replaces", marker, len(over), outA.TypeURL)
	}
	if marker.GetCause() != idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_STORED_BYTES_QUOTA {
		t.Fatalf("marker cause %v; want %v: the outcome was within the size limit, over the quota", marker.GetCause(), idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_STORED_BYTES_QUOTA)
	}
	if got := testutil.ToFloat64(metrics.QuotaCounter(dedupesvc.QuotaBytes)); got != 1 {
		t.Fatalf("idemgate_dedupe_quota_exceeded_total{quota=bytes} = %v, want 1", got)
	}
	// Another caller's outcome of the same size is stored: its quota is its own.
	begun, err := srv.Begin(as("neighbour"), beginReq("/pkg.S/M", "k2", "t1"))
	if err != nil || begun.GetReserved() == nil {
		t.Fatalf("the neighbour's Begin = %v, %v", begun, err)
	}
	if _, err := srv.Finish(as("neighbour"), finishReq("k2", "t1", begun.GetReserved().GetEpoch(), over)); err != nil {
		t.Fatal(err)
	}
	if dup, err := srv.Begin(as("neighbour"), beginReq("/pkg.S/M", "k2", "t2")); err != nil || !bytes.Equal(dup.GetCompleted().GetOutcome().GetValue(), over) {
		t.Fatalf("the neighbour's duplicate = %v, %v; want its outcome", dup, err)
	}
}

// testResolveOnly checks WithResolveOnlySettlesUnknown (-resolve-admin-only):
// once a record is marked outcome-unknown, the attempt that lost it can
// neither settle it by a late Finish or Release, nor revive it by a
// Heartbeat or a re-sent Begin; only Resolve settles it. Without the
// option the late Finish settles it.
func testResolveOnly(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	// lost reserves key for "lost" with the shortest lease and waits until
	// a duplicate finds it outcome-unknown; it returns the lost epoch.
	lost := func(t *testing.T, srv *dedupesvc.Server, key string) int64 {
		t.Helper()
		req := beginReq("/pkg.S/M", key, "lost")
		req.Lease = durationpb.New(dedupesvc.MinLease)
		begun, err := srv.Begin(as("svc"), req)
		if err != nil || begun.GetReserved() == nil {
			t.Fatalf("Begin = %v, %v; want reserved", begun, err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			time.Sleep(100 * time.Millisecond)
			dup, err := srv.Begin(as("svc"), beginReq("/pkg.S/M", key, "dup"))
			if err != nil {
				t.Fatal(err)
			}
			if dup.GetOutcomeUnknown() != nil {
				return begun.GetReserved().GetEpoch()
			}
			if time.Now().After(deadline) {
				t.Fatalf("duplicate Begin = %v a minute after the lease; want outcome unknown", dup)
			}
		}
	}
	wantNotHeld := func(t *testing.T, what string, err error) {
		t.Helper()
		if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != dedupesvc.ReasonReservationNotHeld {
			t.Fatalf("%s = %v; want FAILED_PRECONDITION %s", what, err, dedupesvc.ReasonReservationNotHeld)
		}
	}
	stillUnknown := func(t *testing.T, srv *dedupesvc.Server, key, what string) {
		t.Helper()
		dup, err := srv.Begin(as("svc"), beginReq("/pkg.S/M", key, "dup"))
		if err != nil || dup.GetOutcomeUnknown() == nil {
			t.Fatalf("after %s, a duplicate = %v, %v; want still outcome unknown", what, dup, err)
		}
	}

	t.Run("only Resolve settles an unknown record", func(t *testing.T) {
		t.Parallel()
		srv := dedupesvc.NewServer(newStore(t), dedupesvc.WithResolveOnlySettlesUnknown(true))
		epoch := lost(t, srv, "k")
		_, err := srv.Finish(as("svc"), finishReq("k", "lost", epoch, []byte("late")))
		wantNotHeld(t, "the lost attempt's late Finish", err)
		stillUnknown(t, srv, "k", "the late Finish")
		_, err = srv.Heartbeat(as("svc"), &idemgatev1.HeartbeatRequest{Scope: "/pkg.S/M", Key: "k", AttemptToken: "lost", Epoch: epoch, Lease: durationpb.New(long)})
		wantNotHeld(t, "the lost attempt's late Heartbeat", err)
		stillUnknown(t, srv, "k", "the late Heartbeat")
		again, err := srv.Begin(as("svc"), beginReq("/pkg.S/M", "k", "lost"))
		if err != nil || again.GetOutcomeUnknown() == nil {
			t.Fatalf("the lost attempt's re-sent Begin = %v, %v; want outcome unknown", again, err)
		}
		_, err = srv.Release(as("svc"), &idemgatev1.ReleaseRequest{Scope: "/pkg.S/M", Key: "k", AttemptToken: "lost", Epoch: epoch})
		wantNotHeld(t, "the lost attempt's late Release", err)
		stillUnknown(t, srv, "k", "the late Release")
		if _, err := srv.Resolve(as("svc"), &idemgatev1.ResolveRequest{Scope: "/pkg.S/M", Key: "k",
			Resolution: &idemgatev1.ResolveRequest_Complete{Complete: &anypb.Any{TypeUrl: outA.TypeURL, Value: []byte("resolved")}}}); err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		dup, err := srv.Begin(as("svc"), beginReq("/pkg.S/M", "k", "dup"))
		if err != nil || string(dup.GetCompleted().GetOutcome().GetValue()) != "resolved" {
			t.Fatalf("after Resolve, a duplicate = %v, %v; want the resolved outcome", dup, err)
		}
	})

	t.Run("without it the late Finish settles the record", func(t *testing.T) {
		t.Parallel()
		srv := dedupesvc.NewServer(newStore(t))
		epoch := lost(t, srv, "k")
		if _, err := srv.Finish(as("svc"), finishReq("k", "lost", epoch, []byte("late"))); err != nil {
			t.Fatalf("the late Finish: %v", err)
		}
		dup, err := srv.Begin(as("svc"), beginReq("/pkg.S/M", "k", "dup"))
		if err != nil || string(dup.GetCompleted().GetOutcome().GetValue()) != "late" {
			t.Fatalf("a duplicate = %v, %v; want the late outcome", dup, err)
		}
	})
}
