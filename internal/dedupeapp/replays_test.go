package dedupeapp_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// Replays counted since the last flush are stored when the service stops:
// with an interval no test outlives, only the shutdown flush can have
// stored them.
func TestReplayCountsAreFlushedAtShutdown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	addr, stop := stacktest.StartApp(t, dedupeapp.Config{DataDir: dir, ReplayFlushInterval: time.Hour})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := idemgatev1.NewDedupeServiceClient(conn)
	ctx := context.Background()
	fp := sha256.Sum256([]byte("r"))
	begin := func(token string) *idemgatev1.BeginResponse {
		res, err := client.Begin(ctx, &idemgatev1.BeginRequest{Scope: "/pkg.S/M", Key: "k1", Fingerprint: fp[:], AttemptToken: token,
			Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	r := begin("t1").GetReserved()
	if _, err := client.Finish(ctx, &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "k1", AttemptToken: "t1", Epoch: r.GetEpoch(),
		Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"t2", "t3"} {
		if begin(token).GetCompleted() == nil {
			t.Fatal("no replay")
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantReplayCount(t, dir, "k1", 2, "after shutdown")
}

// wantReplayCount fails unless the embedded store in dir holds record key of
// /pkg.S/M with n replays counted, when (after a shutdown, a Close) the
// counts must have been flushed.
func wantReplayCount(t *testing.T, dir, key string, n int64, when string) {
	t.Helper()
	store, err := sqlitestore.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	rec, found, err := store.GetRecord(context.Background(), dedupesvc.RecordID{Scope: "/pkg.S/M", Key: key})
	if err != nil || !found || rec.ReplayCount != n {
		t.Fatalf("%s: %d replays (found %v, %v), want the %d served", when, rec.ReplayCount, found, err, n)
	}
}
