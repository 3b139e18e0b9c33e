package pgstore_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// TestLargeFinishOfAKeyNeverReservedSendsNoOutcome: a megabyte Finish for a
// key its caller never reserved is refused after one short read: it never
// joins the group commit, where its megabyte would share a transaction, a
// round trip and a commit with other callers' Begins.
func TestLargeFinishOfAKeyNeverReservedSendsNoOutcome(t *testing.T) {
	t.Parallel()
	s := pgstore.New(pgtest.Pool(t), pgstore.WithoutNotify())
	srv := dedupesvc.NewServer(s)
	caller := dedupesvc.ContextWithCaller(ctx, dedupesvc.Caller{Name: "stranger"})
	_, before := s.GroupCommitStats()
	for i := range 3 {
		_, err := srv.Finish(caller, &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "never-reserved", AttemptToken: "t", Epoch: int64(i + 1),
			Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/test.A", Value: make([]byte, 1<<20)}})
		if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != dedupesvc.ReasonReservationNotHeld {
			t.Fatalf("Finish of a key never reserved = %v; want FAILED_PRECONDITION %s", err, dedupesvc.ReasonReservationNotHeld)
		}
	}
	if _, after := s.GroupCommitStats(); after != before {
		t.Fatalf("%d statements went through the group commit for Finishes of a key never reserved; want none", after-before)
	}
}
