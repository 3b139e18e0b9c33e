//go:build faults

// The real-process tests build cmd/dedupesvc (a second, non-race compile of
// every dependency) and start real processes and PostgreSQL clusters: they
// run in `make faults`, which CI runs, not in `make test`.

package outagetest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

const (
	dedupesvcPkg = "github.com/idemgate/idemgate/cmd/dedupesvc"
	// outage is how long the store stays away: over twice the 4s lease of
	// the methods under test.
	outage = 9 * time.Second
	// patience bounds a wait for something that must happen; generous, as
	// the machine is shared.
	patience = 2 * time.Minute
)

// store is one way to run the Dedupe service and take it away.
type store struct {
	name string
	// start runs the service on addr and returns how to cause the outage
	// and how to end it.
	start func(t *testing.T, addr string) (down, up func())
}

func stores(bin string) []store {
	serve := func(t *testing.T, addr string, args ...string) *proctest.Process {
		p := proctest.Start(t, bin, append([]string{"-listen", addr, "-metrics-listen="}, args...), nil)
		p.WaitTCP(t, addr, patience)
		return p
	}
	return []store{
		{"dedupe service killed, PostgreSQL", func(t *testing.T, addr string) (func(), func()) {
			args := []string{"-database-url", pgtest.SchemaURL(t)}
			p := serve(t, addr, args...)
			return func() { p.Kill() }, func() { p = serve(t, addr, args...) }
		}},
		{"PostgreSQL crashed", func(t *testing.T, addr string) (func(), func()) {
			cluster := pgtest.NewCluster(t)
			serve(t, addr, "-database-url", cluster.URL("postgres"))
			return func() { cluster.Stop(t, "immediate") }, func() { cluster.Start(t) }
		}},
		{"dedupe service killed, embedded store", func(t *testing.T, addr string) (func(), func()) {
			args := []string{"-database-url=", "-data-dir", t.TempDir()}
			p := serve(t, addr, args...)
			return func() { p.Kill() }, func() { p = serve(t, addr, args...) }
		}},
	}
}

// A holder whose handler has returned waits for the store to take its
// outcome. While the store is away no lease can be renewed; once it is
// back, the holder must get a full lease to renew before anyone takes the
// key over (REEXECUTE) or declares its outcome unknown (FAIL_CLOSED).
func TestStoreOutageLongerThanTheLeaseCostsTheHolderNothing(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, dedupesvcPkg)
	methods := []struct {
		name string
		call func(testingv1.TestServiceClient) func(context.Context, *testingv1.MutateRequest, ...grpc.CallOption) (*testingv1.MutateResponse, error)
	}{
		{"reexecute", func(c testingv1.TestServiceClient) func(context.Context, *testingv1.MutateRequest, ...grpc.CallOption) (*testingv1.MutateResponse, error) {
			return c.MutateHeldReexecute
		}},
		{"fail closed", func(c testingv1.TestServiceClient) func(context.Context, *testingv1.MutateRequest, ...grpc.CallOption) (*testingv1.MutateResponse, error) {
			return c.MutateHeld
		}},
	}
	for _, st := range stores(bin) {
		for _, m := range methods {
			t.Run(st.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				addr := stacktest.FreeAddr(t)
				down, up := st.start(t, addr)

				// The first Finish finds the store gone for three leases;
				// a duplicate that arrives once it is back must find the
				// key still in flight.
				// The holder's renewals are held back until the duplicate is
				// answered, so the answer depends on the grace alone, not on
				// which of the two reaches the store first.
				var (
					client     testingv1.TestServiceClient
					outageDone atomic.Bool
					holdBack   atomic.Bool
					duplicate  error
				)
				hook := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					switch {
					case method == idemgatev1.DedupeService_Heartbeat_FullMethodName && holdBack.Load():
						return status.Error(codes.Unavailable, "test: renewals held back")
					case method == idemgatev1.DedupeService_Finish_FullMethodName && outageDone.CompareAndSwap(false, true):
						holdBack.Store(true)
						down()
						time.Sleep(outage)
						up()
						duplicate = answerOnceBack(t, func() error {
							_, err := m.call(client)(withKey("order-1"), &testingv1.MutateRequest{Payload: "charge"})
							return err
						})
						holdBack.Store(false)
					}
					return invoker(ctx, method, req, reply, cc, opts...)
				}
				svc := &testsvc.Server{}
				client = gatedTool(t, addr, svc, hook)

				resp, err := m.call(client)(withKey("order-1"), &testingv1.MutateRequest{Payload: "charge"})
				if err != nil {
					t.Fatalf("first call: %v", err)
				}
				if status.Code(duplicate) != codes.Aborted || grpcerr.Reason(duplicate) != idemgate.ReasonInFlight {
					t.Fatalf("duplicate right after the store came back: %v; want ABORTED %s, the holder was alive", duplicate, idemgate.ReasonInFlight)
				}
				var header metadata.MD
				var again *testingv1.MutateResponse
				for deadline := time.Now().Add(patience); ; time.Sleep(100 * time.Millisecond) {
					again, err = m.call(client)(withKey("order-1"), &testingv1.MutateRequest{Payload: "charge"}, grpc.Header(&header))
					if status.Code(err) != codes.Aborted && status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
						break
					}
				}
				if err != nil || again.GetExecution() != resp.GetExecution() || len(header.Get(idemgate.ReplayedHeader)) != 1 {
					t.Fatalf("duplicate after the Finish: %v %v, want the first outcome replayed", again, err)
				}
				if got := svc.Executions(); got != 1 {
					t.Fatalf("%d executions, want 1", got)
				}
			})
		}
	}
}

// answerOnceBack makes call until the Dedupe service answers it (an
// UNAVAILABLE means the service or its database is still coming back) and
// returns that answer.
func answerOnceBack(t *testing.T, call func() error) error {
	deadline := time.Now().Add(patience)
	for {
		err := call()
		if grpcerr.Reason(err) != idemgate.ReasonStoreUnavailable || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gatedTool serves the test service gated by a Gate whose Dedupe client
// talks to addr through hook, and returns a client of it.
func gatedTool(t *testing.T, addr string, svc *testsvc.Server, hook grpc.UnaryClientInterceptor) testingv1.TestServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig),
		grpc.WithChainUnaryInterceptor(hook),
		// Reconnect quickly to a restarted service: the default backoff
		// grows to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}, MinConnectTimeout: 5 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		_ = gate.Close(ctx)
	})
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	testingv1.RegisterTestServiceServer(srv, svc)
	return testingv1.NewTestServiceClient(stacktest.Serve(t, srv))
}

func withKey(key string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	_ = cancel // bounds a hung test; it ends with the test process
	return metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key)
}
