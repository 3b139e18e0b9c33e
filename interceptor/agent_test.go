package interceptor_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// agentRecorder is a Dedupe service that notes the agent each Begin names
// and refuses it.
type agentRecorder struct {
	idemgatev1.UnimplementedDedupeServiceServer
	mu     sync.Mutex
	agents []string
}

func (a *agentRecorder) Begin(ctx context.Context, _ *idemgatev1.BeginRequest) (*idemgatev1.BeginResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	a.mu.Lock()
	a.agents = append(a.agents, md.Get(dedupesvc.AgentHeader)...)
	a.mu.Unlock()
	return nil, status.Error(codes.PermissionDenied, "recorded")
}

// The gate names each call's tenant, the end caller, to the Dedupe service
// (dedupesvc.AgentHeader), so a service that trusts this tool server to
// forward applies its rate per agent, not to the tool server as one.
func TestGateForwardsTheTenantAsAgent(t *testing.T) {
	t.Parallel()
	rec := &agentRecorder{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(srv, rec)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn := dialDedupe(t, lis.Addr().String())
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn),
		interceptor.WithTenant(func(context.Context) (string, error) { return "agent-ü-7", nil }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gate.Close(context.Background()) })
	_, err = gatedTool(t, gate).Mutate(withKey("k1"), &testingv1.MutateRequest{Payload: "charge"})
	if err == nil {
		t.Fatal("the call succeeded against a refusing Dedupe service")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.agents) != 1 || rec.agents[0] != "agent-ü-7" {
		t.Fatalf("the Dedupe service saw agents %q, want the tenant %q once", rec.agents, "agent-ü-7")
	}
}

// heartbeatCounter is fakeDedupe counting Heartbeats.
type heartbeatCounter struct {
	*fakeDedupe
	heartbeats atomic.Int64
}

func (h *heartbeatCounter) Heartbeat(ctx context.Context, in *idemgatev1.HeartbeatRequest) (*idemgatev1.HeartbeatResponse, error) {
	h.heartbeats.Add(1)
	return h.fakeDedupe.Heartbeat(ctx, in)
}

// WatchDedupe checks the Dedupe service (one Heartbeat) each time its
// connection becomes ready, without waiting for a gated call: the check
// proves the credentials, and a Dedupe service that closes connections not
// authenticated within -unauthenticated-timeout keeps a quiet tool
// server's connection, whose health would otherwise flap.
func TestWatchDedupeChecksEachNewConnection(t *testing.T) {
	t.Parallel()
	counter := &heartbeatCounter{fakeDedupe: &fakeDedupe{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(srv, counter)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn := dialDedupe(t, lis.Addr().String())
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), interceptor.WithDedupeConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gate.Close(context.Background()) })
	hs := health.NewServer()
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { gate.WatchDedupe(ctx, hs); close(watched) }()
	t.Cleanup(func() { cancel(); <-watched })
	waitHealth(t, hs, healthpb.HealthCheckResponse_SERVING)
	for range 1200 {
		if counter.heartbeats.Load() > 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("WatchDedupe made no check on its new connection within a minute")
}
