package gatecore

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// answering is a Dedupe client whose every RPC answers err.
type answering struct {
	idemgatev1.DedupeServiceClient
	err error
}

func (a *answering) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return nil, a.err
}

func (a *answering) Finish(context.Context, *idemgatev1.FinishRequest, ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	return nil, a.err
}

func (a *answering) Release(context.Context, *idemgatev1.ReleaseRequest, ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	return nil, a.err
}

func (a *answering) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	return nil, a.err
}

func (a *answering) Resolve(context.Context, *idemgatev1.ResolveRequest, ...grpc.CallOption) (*idemgatev1.ResolveResponse, error) {
	return nil, a.err
}

// resets counts ResetConnectBackoff calls.
type resets int

func (r *resets) ResetConnectBackoff() { *r++ }

// Only UNAVAILABLE cuts the backoff, whichever RPC gets it, and at most once
// per ReconnectInterval; a clock that went back counts as due.
func TestReconnectingCutsTheBackoffOnUnavailableAtMostEveryInterval(t *testing.T) {
	inner := &answering{}
	var n resets
	c := Reconnecting(inner, &n).(*reconnecting)
	clock := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return clock }
	ctx := context.Background()
	rpcs := []func(){
		func() { _, _ = c.Begin(ctx, nil) },
		func() { _, _ = c.Finish(ctx, nil) },
		func() { _, _ = c.Release(ctx, nil) },
		func() { _, _ = c.Heartbeat(ctx, nil) },
		func() { _, _ = c.Resolve(ctx, nil) },
	}

	for _, code := range []codes.Code{codes.OK, codes.DeadlineExceeded, codes.FailedPrecondition, codes.Unauthenticated, codes.Internal} {
		inner.err = status.Error(code, "no")
		if code == codes.OK {
			inner.err = nil
		}
		for _, rpc := range rpcs {
			rpc()
		}
	}
	if n != 0 {
		t.Fatalf("%d resets after answers other than UNAVAILABLE, want 0", n)
	}

	inner.err = status.Error(codes.Unavailable, "connection refused")
	for i, rpc := range rpcs {
		rpc()
		if n != resets(i+1) {
			t.Fatalf("after %d UNAVAILABLE answers %s apart, %d resets, want %d", i+1, ReconnectInterval, n, i+1)
		}
		clock = clock.Add(ReconnectInterval)
	}
	clock = clock.Add(-ReconnectInterval) // back to the last reset
	n = 0
	for range 3 {
		c.Heartbeat(ctx, nil)
		clock = clock.Add(ReconnectInterval / 4)
	}
	if n != 0 {
		t.Fatalf("%d resets within %s of the last, want 0", n, ReconnectInterval)
	}
	clock = clock.Add(ReconnectInterval / 4)
	c.Heartbeat(ctx, nil)
	clock = clock.Add(-time.Hour)
	c.Heartbeat(ctx, nil)
	if n != 2 {
		t.Fatalf("%d resets once the interval passed and after the clock went back, want 2", n)
	}
}
