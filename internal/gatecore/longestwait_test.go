package gatecore_test

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
)

var measureWait = flag.Bool("gatecore.measure-wait", false, "measure the longest wait of a caller whose first Finish fails, with the default options and a 10s lease (about 40s)")

// unreachableFinish reserves and renews nothing; each Finish fails
// UNAVAILABLE at once, or, with hang, waits out its deadline first (a
// Finish sent into a partition).
type unreachableFinish struct {
	idemgatev1.DedupeServiceClient
	hang     bool
	finishes atomic.Int64
}

func (d *unreachableFinish) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{Epoch: 1}}}, nil
}

func (d *unreachableFinish) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	return nil, status.Error(codes.Unavailable, "cut off")
}

func (d *unreachableFinish) Finish(ctx context.Context, _ *idemgatev1.FinishRequest, _ ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	d.finishes.Add(1)
	if d.hang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return nil, status.Error(codes.Unavailable, "cut off")
}

// TestLongestWaitWhenTheFirstFinishFails measures (it asserts no time) how
// long a holder's caller waits for its answer when no Finish gets through,
// with the default options (5s outcome timeout) and a 10s lease: the
// first Finish failing at once, and hanging until the outcome timeout.
// Run with -gatecore.measure-wait; docs/failure-semantics.md has the
// figures.
func TestLongestWaitWhenTheFirstFinishFails(t *testing.T) {
	if !*measureWait {
		t.Skip("a measurement of about 40s: go test -run TestLongestWaitWhenTheFirstFinishFails -gatecore.measure-wait ./internal/gatecore/")
	}
	outcome, err := anypb.New(wrapperspb.String("charged"))
	if err != nil {
		t.Fatal(err)
	}
	const lease = 10 * time.Second
	for _, hang := range []bool{false, true} {
		d := &unreachableFinish{hang: hang}
		e := gatecore.New(d, gatecore.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		c := gatecore.NewCall("tool", "scope", "key-1", []byte("fp"), gatecore.Policy{Lease: lease, MaxWait: time.Second, ExecutionTimeout: time.Hour}, time.Hour)
		begun, err := e.Begin(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		a := e.Start(context.Background(), c, begun)
		start := time.Now()
		fenced := a.Finish(outcome, false)
		waited := time.Since(start)
		t.Logf("first Finish hangs %t: the caller waited %v (%d Finish attempts), answered fenced/unstored %t", hang, waited.Round(10*time.Millisecond), d.finishes.Load(), fenced)
		if !fenced {
			t.Errorf("an outcome never stored was answered as stored")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = e.Close(ctx) // the background retries run for the finish retry budget: cut them short
		cancel()
	}
}
