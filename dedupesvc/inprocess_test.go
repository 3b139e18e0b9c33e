package dedupesvc_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

func TestInProcessClient(t *testing.T) {
	t.Parallel()
	store, err := sqlitestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	client := dedupesvc.NewInProcessClient(dedupesvc.NewServer(store))
	// An authenticated caller in the context is not the service's caller:
	// an in-process call is an unauthenticated one, in the empty namespace.
	ctx := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "spiffe://x/tool", Admin: true})
	fp := sha256.Sum256([]byte("r"))
	begin := &idemgatev1.BeginRequest{Scope: "/x.S/M", Key: "k", Fingerprint: fp[:], AttemptToken: "a",
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}
	res, err := client.Begin(ctx, begin)
	if err != nil || res.GetReserved() == nil {
		t.Fatalf("Begin = %v, %v; want reserved", res, err)
	}
	finish := &idemgatev1.FinishRequest{Scope: "/x.S/M", Key: "k", AttemptToken: "a", Epoch: res.GetReserved().GetEpoch(),
		Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/x.R", Value: []byte("stored")}}
	if _, err := client.Finish(ctx, finish); err != nil {
		t.Fatal(err)
	}
	finish.Outcome.Value[0] = 'X' // the caller's later change must not reach the record

	records, err := store.ListRecords(context.Background(), dedupesvc.ListQuery{Limit: 10})
	if err != nil || len(records) != 1 || records[0].ID.Namespace != "" {
		t.Fatalf("records: %+v, %v; want the one Begin made, in the empty namespace", records, err)
	}
	begin.AttemptToken = "b"
	res, err = client.Begin(context.Background(), begin)
	if got := string(res.GetCompleted().GetOutcome().GetValue()); err != nil || got != "stored" {
		t.Fatalf("replay = %q, %v; want %q", got, err, "stored")
	}

	// Errors are the service's status errors, and the context's.
	begin.Fingerprint = nil
	_, err = client.Begin(context.Background(), begin)
	if status.Code(err) != codes.InvalidArgument || grpcerr.Reason(err) != dedupesvc.ReasonInvalidRequest {
		t.Errorf("Begin without a fingerprint = %v, want INVALID_ARGUMENT %s", err, dedupesvc.ReasonInvalidRequest)
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := client.Heartbeat(canceled, &idemgatev1.HeartbeatRequest{}); status.Code(err) != codes.Canceled {
		t.Errorf("Heartbeat on a canceled context = %v, want CANCELED", err)
	}
}

// The in-process client says so, so a gate given it does not warn that it
// lacks WithDedupeConn (gatecore.NewObserver).
func TestInProcessClientSaysSo(t *testing.T) {
	c, ok := dedupesvc.NewInProcessClient(nil).(interface{ InProcess() bool })
	if !ok || !c.InProcess() {
		t.Fatal("NewInProcessClient's client has no InProcess method reporting true: every gate on it warns of a missing WithDedupeConn")
	}
}
