package netfault_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/internal/testing/netfault"
)

// faultDeadline is the deadline of a call expected to fail: long enough for a
// loaded machine to deliver a call that would get through, short enough to
// keep the test quick. okDeadline bounds a call expected to succeed, with the
// client's reconnect backoff.
const (
	faultDeadline = 3 * time.Second
	okDeadline    = time.Minute
)

// healthServer serves gRPC health on a loopback port until the test ends and
// counts the calls that reached it.
func healthServer(t *testing.T) (addr string, calls *atomic.Int64) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	calls = new(atomic.Int64)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), calls
}

func client(t *testing.T, addr string) healthpb.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// check makes one health call with deadline; waitForReady rides over a
// reconnect.
func check(c healthpb.HealthClient, deadline time.Duration, waitForReady bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(waitForReady))
	return err
}

// mustSucceed calls until a call succeeds, retrying UNAVAILABLE for up to
// okDeadline: a call that races a connection's cut fails so, as on any
// dropped connection, and callers retry it.
func mustSucceed(t *testing.T, c healthpb.HealthClient, what string) {
	t.Helper()
	deadline := time.Now().Add(okDeadline)
	for {
		err := check(c, okDeadline, true)
		if err == nil {
			return
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("call %s: %v; want success", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wantCode(t *testing.T, err error, want codes.Code, what string) {
	t.Helper()
	if status.Code(err) != want {
		t.Fatalf("call %s = %v; want %v", what, err, want)
	}
}

func TestFaultsAndHeal(t *testing.T) {
	t.Parallel()
	addr, _ := healthServer(t)
	p := netfault.NewProxy(t, addr)
	c := client(t, p.Addr())
	mustSucceed(t, c, "through the proxy")

	p.Blackhole()
	wantCode(t, check(c, faultDeadline, false), codes.DeadlineExceeded, "under Blackhole")
	p.Heal()
	mustSucceed(t, c, "after healing Blackhole")

	p.Reset()
	wantCode(t, check(c, okDeadline, false), codes.Unavailable, "under Reset")
	p.Heal()
	mustSucceed(t, c, "after healing Reset")

	p.Latency(200 * time.Millisecond)
	mustSucceed(t, c, "under Latency") // slower, never timed: the machine is shared
	p.Heal()
	mustSucceed(t, c, "after healing Latency")
}

func TestBlackholeOnNewConnections(t *testing.T) {
	t.Parallel()
	addr, _ := healthServer(t)
	p := netfault.NewProxy(t, addr)
	p.Blackhole()
	// The client connects only now: the proxy accepts, but the handshake
	// never gets through.
	c := client(t, p.Addr())
	wantCode(t, check(c, faultDeadline, false), codes.DeadlineExceeded, "under Blackhole, first connection")
	p.Heal()
	mustSucceed(t, c, "after Heal")
}

func TestResetOnNewConnections(t *testing.T) {
	t.Parallel()
	addr, _ := healthServer(t)
	p := netfault.NewProxy(t, addr)
	p.Reset()
	c := client(t, p.Addr())
	wantCode(t, check(c, okDeadline, false), codes.Unavailable, "under Reset, first connection")
	p.Heal()
	mustSucceed(t, c, "after Heal")
}

func TestTimeoutClosesConnections(t *testing.T) {
	t.Parallel()
	addr, _ := healthServer(t)
	p := netfault.NewProxy(t, addr)
	c := client(t, p.Addr())
	mustSucceed(t, c, "through the proxy")
	p.Timeout(100 * time.Millisecond)
	// Whether the call rides the old connection (closed by the timeout) or a
	// new one (closed after 100ms without a byte through), it fails as
	// UNAVAILABLE well before its deadline.
	wantCode(t, check(c, okDeadline, false), codes.Unavailable, "under Timeout")
	p.Heal()
	mustSucceed(t, c, "after Heal")
}

func TestDropRepliesLetsRequestsThrough(t *testing.T) {
	t.Parallel()
	addr, calls := healthServer(t)
	p := netfault.NewProxy(t, addr)
	c := client(t, p.Addr())
	mustSucceed(t, c, "through the proxy")
	before := calls.Load()
	p.DropReplies()
	wantCode(t, check(c, faultDeadline, false), codes.DeadlineExceeded, "under DropReplies")
	// The request reached the server: it did the work, only the answer was
	// lost. The call's deadline has passed, so its handler has run.
	deadline := time.Now().Add(okDeadline)
	for calls.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("under DropReplies no request reached the server")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.Heal()
	mustSucceed(t, c, "after Heal")
}

func TestCutClosesOpenConnections(t *testing.T) {
	t.Parallel()
	addr, _ := healthServer(t)
	p := netfault.NewProxy(t, addr)
	conn, err := grpc.NewClient(p.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A watch stream holds the connection open until it is cut.
	ctx, cancel := context.WithTimeout(context.Background(), okDeadline)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("first Watch message: %v", err)
	}
	p.Cut()
	_, err = stream.Recv()
	wantCode(t, err, codes.Unavailable, "Watch after Cut")
	mustSucceed(t, healthpb.NewHealthClient(conn), "after Cut")
}

// A fault that follows a lossy one without Heal runs on fresh connections:
// the ones with gaps in their byte streams are cut.
func TestNextFaultCutsConnectionsALossyFaultTouched(t *testing.T) {
	t.Parallel()
	addr, _ := healthServer(t)
	p := netfault.NewProxy(t, addr)
	c := client(t, p.Addr())
	mustSucceed(t, c, "through the proxy")
	p.DropReplies()
	wantCode(t, check(c, faultDeadline, false), codes.DeadlineExceeded, "under DropReplies")
	p.Latency(10 * time.Millisecond)
	mustSucceed(t, c, "under Latency after DropReplies")
}
