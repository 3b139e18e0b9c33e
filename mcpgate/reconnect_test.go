package mcpgate_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/mcpgate"
)

// renewals is a Dedupe service that says on renewed when a Heartbeat
// renewed a lease.
type renewals struct {
	idemgatev1.DedupeServiceServer
	renewed chan struct{}
}

func (r *renewals) Heartbeat(ctx context.Context, in *idemgatev1.HeartbeatRequest) (*idemgatev1.HeartbeatResponse, error) {
	resp, err := r.DedupeServiceServer.Heartbeat(ctx, in)
	if err == nil {
		select {
		case r.renewed <- struct{}{}:
		default:
		}
	}
	return resp, err
}

// serveDedupe serves svc over gRPC on addr ("127.0.0.1:0" for any port)
// until the returned server is stopped.
func serveDedupe(t *testing.T, addr string, svc idemgatev1.DedupeServiceServer) (*grpc.Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return srv, lis.Addr().String()
}

// A holder whose Dedupe service goes away and comes back renews its lease
// with the restarted service and stores its outcome: the connection waits an
// hour between attempts, so only the gate cutting the backoff on a failing
// renewal (WithDedupeConn) can reconnect it while the test runs.
func TestAHolderRenewsWithARestartedDedupeService(t *testing.T) {
	t.Parallel()
	store, err := sqlitestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	svc := dedupesvc.NewServer(store, dedupesvc.WithNotifier(store), dedupesvc.WithLogger(quiet()))
	srv, addr := serveDedupe(t, "127.0.0.1:0", &renewals{DedupeServiceServer: svc, renewed: make(chan struct{}, 1)})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: time.Hour, Multiplier: 1, MaxDelay: time.Hour}, MinConnectTimeout: 5 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	// A lease long enough for a starved scheduler: renewed every 7s, every
	// 2s while renewals fail.
	f := setup(t, idemgatev1.NewDedupeServiceClient(conn), mcpgate.WithDedupeConn(conn),
		mcpgate.WithTool("charge", mcpgate.ToolPolicy{Lease: 20 * time.Second}))
	f.tools.hold, f.tools.started, f.tools.ended = make(chan struct{}), make(chan struct{}, 1), make(chan error, 1)

	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	answers := make(chan answer, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	go func() {
		res, err := f.client.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: order, Meta: mcp.Meta{mcpgate.MetaKey: "order-restart"}})
		answers <- answer{res, err}
	}()
	<-f.tools.started // the holder runs

	srv.Stop()
	// A renewal fails, the connection fails to reconnect and waits its hour.
	waitUntil(t, func() bool { return conn.GetState() == connectivity.TransientFailure })
	back := &renewals{DedupeServiceServer: svc, renewed: make(chan struct{}, 1)}
	serveDedupe(t, addr, back)
	select {
	case <-back.renewed:
	case <-time.After(time.Minute): // only a bound on a hung test
		t.Fatalf("no renewal reached the restarted Dedupe service within a minute (connection %s)", conn.GetState())
	}

	close(f.tools.hold)
	a := <-answers
	if a.err != nil {
		t.Fatalf("the holder's call: %v", a.err)
	}
	if err := <-f.tools.ended; err != nil {
		t.Fatalf("the holder's context ended with %v", err)
	}
	want := structured(t, a.res)["charge_id"]
	if replayed(a.res) {
		t.Fatalf("the holder's result %+v is marked replayed", a.res)
	}
	var dup *mcp.CallToolResult
	for dup = call(t, f.client, "charge", "order-restart", order); dup.IsError; dup = call(t, f.client, "charge", "order-restart", order) {
		wantReason(t, dup, idemgate.ReasonInFlight) // the Finish may still be on its way
	}
	if !replayed(dup) || structured(t, dup)["charge_id"] != want || f.tools.charges.Load() != 1 {
		t.Fatalf("duplicate = %+v after %d charges, want the replay of %v", dup, f.tools.charges.Load(), want)
	}
}

// waitUntil polls cond until it holds, failing the test after a minute.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the condition did not hold within a minute")
		}
	}
}
