package interceptor_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
