package gatecore

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// ReconnectInterval is how often at most a failing Dedupe RPC cuts the
// connection's reconnect backoff short (Reconnecting): a dead service gets
// at most two connection attempts a second from one tool server, while one
// that came back is reached within half a second.
const ReconnectInterval = 500 * time.Millisecond

// BackoffResetter is the part of *grpc.ClientConn Reconnecting uses.
type BackoffResetter interface {
	ResetConnectBackoff()
}

// Reconnecting returns client, except that a call that fails UNAVAILABLE
// makes conn try to connect now rather than when its backoff ends
// (ResetConnectBackoff), at most every ReconnectInterval. A Dedupe service
// restarted after an outage grants in-flight leases one lease; grpc-go's
// default backoff, grown during the outage to up to two minutes, could keep
// the holders from renewing until that grace is over, and a duplicate
// reaching the service first would take the key over or mark it
// outcome-unknown. A connection that is ready or connecting is not
// disturbed. conn must not be nil.
func Reconnecting(client idemgatev1.DedupeServiceClient, conn BackoffResetter) idemgatev1.DedupeServiceClient {
	return &reconnecting{DedupeServiceClient: client, conn: conn, now: time.Now}
}

// reconnecting is Reconnecting's client.
type reconnecting struct {
	idemgatev1.DedupeServiceClient
	conn BackoffResetter
	now  func() time.Time

	mu sync.Mutex
	// last is when a failure last cut the backoff.
	last time.Time
}

// Begin implements idemgatev1.DedupeServiceClient.
func (r *reconnecting) Begin(ctx context.Context, in *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	resp, err := r.DedupeServiceClient.Begin(ctx, in, opts...)
	r.observe(err)
	return resp, err
}

// Finish implements idemgatev1.DedupeServiceClient.
func (r *reconnecting) Finish(ctx context.Context, in *idemgatev1.FinishRequest, opts ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	resp, err := r.DedupeServiceClient.Finish(ctx, in, opts...)
	r.observe(err)
	return resp, err
}

// Release implements idemgatev1.DedupeServiceClient.
func (r *reconnecting) Release(ctx context.Context, in *idemgatev1.ReleaseRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	resp, err := r.DedupeServiceClient.Release(ctx, in, opts...)
	r.observe(err)
	return resp, err
}

// Heartbeat implements idemgatev1.DedupeServiceClient.
func (r *reconnecting) Heartbeat(ctx context.Context, in *idemgatev1.HeartbeatRequest, opts ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	resp, err := r.DedupeServiceClient.Heartbeat(ctx, in, opts...)
	r.observe(err)
	return resp, err
}

// ReleaseLostBegins implements idemgatev1.DedupeServiceClient.
func (r *reconnecting) ReleaseLostBegins(ctx context.Context, in *idemgatev1.ReleaseLostBeginsRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	resp, err := r.DedupeServiceClient.ReleaseLostBegins(ctx, in, opts...)
	r.observe(err)
	return resp, err
}

// Resolve implements idemgatev1.DedupeServiceClient.
func (r *reconnecting) Resolve(ctx context.Context, in *idemgatev1.ResolveRequest, opts ...grpc.CallOption) (*idemgatev1.ResolveResponse, error) {
	resp, err := r.DedupeServiceClient.Resolve(ctx, in, opts...)
	r.observe(err)
	return resp, err
}

// observe cuts the backoff after an UNAVAILABLE answer, unless it was cut
// less than ReconnectInterval ago (a clock that went back counts as due).
func (r *reconnecting) observe(err error) {
	if status.Code(err) != codes.Unavailable {
		return
	}
	r.mu.Lock()
	now := r.now()
	due := r.last.IsZero() || now.Sub(r.last) >= ReconnectInterval || now.Before(r.last)
	if due {
		r.last = now
	}
	r.mu.Unlock()
	if due {
		r.conn.ResetConnectBackoff()
	}
}
