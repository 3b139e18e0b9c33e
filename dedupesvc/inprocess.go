package dedupesvc

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// NewInProcessClient returns a client that calls srv's methods directly, in
// this process, with no network hop: for a tool server that runs its own
// Dedupe service (one process, the embedded store), for tests and for
// demos. To the interceptor it behaves like a client of srv served without
// authentication on loopback:
//   - srv sees a context with the caller's deadline and cancellation and
//     none of its values: no authenticated Caller (so the records are in the
//     empty namespace, as an unauthenticated call's), no incoming metadata
//     and no gRPC stream of the tool server's own call;
//   - requests are cloned before srv sees them and responses before the
//     caller does, so neither side's later change reaches the other (or a
//     stored record);
//   - every error is a gRPC status error: srv's own, the context's as
//     CANCELLED or DEADLINE_EXCEEDED, and anything else as UNKNOWN.
//
// Call options (grpc.Header, grpc.WaitForReady, ...) are ignored: there is
// no transport for them to act on, and no header to receive. The service's
// gRPC server interceptors (metrics, logging, authentication) do not run.
func NewInProcessClient(srv *Server) idemgatev1.DedupeServiceClient {
	return inProcessClient{srv: srv}
}

type inProcessClient struct{ srv *Server }

// InProcess reports true: a gate given this client has no connection to
// name with WithDedupeConn, and does not warn of one missing.
func (inProcessClient) InProcess() bool { return true }

// invoke runs one method the way a network call would reach it.
func invoke[Req, Resp proto.Message](ctx context.Context, req Req, method func(context.Context, Req) (Resp, error)) (Resp, error) {
	var zero Resp
	if err := ctx.Err(); err != nil {
		return zero, status.FromContextError(err).Err()
	}
	resp, err := method(valueless{ctx}, proto.CloneOf(req))
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Unknown, err.Error())
		}
		return zero, err
	}
	return proto.CloneOf(resp), nil
}

// Begin implements idemgatev1.DedupeServiceClient.
func (c inProcessClient) Begin(ctx context.Context, req *idemgatev1.BeginRequest, _ ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return invoke(ctx, req, c.srv.Begin)
}

// Finish implements idemgatev1.DedupeServiceClient.
func (c inProcessClient) Finish(ctx context.Context, req *idemgatev1.FinishRequest, _ ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	return invoke(ctx, req, c.srv.Finish)
}

// Release implements idemgatev1.DedupeServiceClient.
func (c inProcessClient) Release(ctx context.Context, req *idemgatev1.ReleaseRequest, _ ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	return invoke(ctx, req, c.srv.Release)
}

// ReleaseLostBegins implements idemgatev1.DedupeServiceClient.
func (c inProcessClient) ReleaseLostBegins(ctx context.Context, req *idemgatev1.ReleaseLostBeginsRequest, _ ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	return invoke(ctx, req, c.srv.ReleaseLostBegins)
}

// Heartbeat implements idemgatev1.DedupeServiceClient.
func (c inProcessClient) Heartbeat(ctx context.Context, req *idemgatev1.HeartbeatRequest, _ ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	return invoke(ctx, req, c.srv.Heartbeat)
}

// Resolve implements idemgatev1.DedupeServiceClient.
func (c inProcessClient) Resolve(ctx context.Context, req *idemgatev1.ResolveRequest, _ ...grpc.CallOption) (*idemgatev1.ResolveResponse, error) {
	return invoke(ctx, req, c.srv.Resolve)
}

// valueless is a context with its parent's deadline and cancellation but
// none of its values: what reaches a service across the network.
type valueless struct{ parent context.Context }

func (v valueless) Deadline() (time.Time, bool) { return v.parent.Deadline() }
func (v valueless) Done() <-chan struct{}       { return v.parent.Done() }
func (v valueless) Err() error                  { return v.parent.Err() }
func (v valueless) Value(any) any               { return nil }
