//go:build faults

package outagetest_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// restartOutage is how long the Dedupe service stays down at least: long
// enough that grpc-go's default reconnect backoff (1s, x1.6, jitter 0.2)
// waits at least 13s before its next attempt.
const restartOutage = 20 * time.Second

// A tool server dials the Dedupe service as docs/gating.md shows, with
// grpc-go's default reconnect backoff, and holds a key in a long handler
// when the service is killed. The service comes back on the same address
// after an outage, just after the holder's connection failed an attempt,
// so the backoff alone would keep the holder away for 13s or more; the
// restart grants in-flight leases one more lease, and the holder must renew
// within it. A duplicate through another tool server once that grace is
// over must find the key in flight (no re-run under REEXECUTE, no
// OUTCOME_UNKNOWN under FAIL_CLOSED), and the holder's outcome is then
// stored and replayed.
func TestRestartWithTheDefaultReconnectBackoffKeepsTheHolder(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, dedupesvcPkg)
	for _, m := range []struct {
		name, method string
		call         func(testingv1.ChaosServiceClient) func(context.Context, *testingv1.ChargeRequest, ...grpc.CallOption) (*testingv1.ChargeResponse, error)
	}{
		{"reexecute", testingv1.ChaosService_ChargeReexecute_FullMethodName, func(c testingv1.ChaosServiceClient) func(context.Context, *testingv1.ChargeRequest, ...grpc.CallOption) (*testingv1.ChargeResponse, error) {
			return c.ChargeReexecute
		}},
		{"fail closed", testingv1.ChaosService_Charge_FullMethodName, func(c testingv1.ChaosServiceClient) func(context.Context, *testingv1.ChargeRequest, ...grpc.CallOption) (*testingv1.ChargeResponse, error) {
			return c.Charge
		}},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			addr := stacktest.FreeAddr(t)
			args := []string{"-listen", addr, "-metrics-listen=", "-database-url", pgtest.SchemaURL(t)}
			serve := func() *proctest.Process {
				p := proctest.Start(t, bin, args, nil)
				p.WaitTCP(t, addr, patience)
				return p
			}
			dedupe := serve()

			svc := &holdingCharges{started: make(chan struct{}), release: make(chan struct{})}
			defer svc.releaseHolder()
			dials := &dialLog{}
			holderTool, gate := readmeTool(t, addr, svc, dials.dial)
			lease := gate.Policy(m.method).Lease
			req := &testingv1.ChargeRequest{Action: "order-1", AmountCents: 100}

			type answer struct {
				resp *testingv1.ChargeResponse
				err  error
			}
			holder := make(chan answer, 1)
			go func() {
				resp, err := m.call(holderTool)(withKey("order-1"), req)
				holder <- answer{resp, err}
			}()
			select {
			case <-svc.started:
			case a := <-holder:
				t.Fatalf("the holder answered before its handler started: %v %v", a.resp, a.err)
			case <-time.After(patience):
				t.Fatal("the holder's handler never started")
			}

			dedupe.Kill()
			// Restart right after the holder's connection failed an attempt
			// past the outage: its next attempt is then one long backoff away.
			dials.waitFailureAfter(t, time.Now().Add(restartOutage))
			serve() // proctest stops it when the test ends
			// The service marked the store resumed before it listened: the
			// grace of one lease is over once a lease has passed since.
			time.Sleep(lease + time.Second)

			// Another tool server (a replica, or one that starts now)
			// reaches the restarted service at once.
			otherTool, _ := readmeTool(t, addr, svc, nil)
			dup := answerOnceBack(t, func() error {
				_, err := m.call(otherTool)(withKey("order-1"), req)
				return err
			})
			if got := svc.executions.Load(); got != 1 {
				t.Fatalf("a duplicate after the restart's grace ran the action again (%d executions, answer %v); the holder was alive", got, dup)
			}
			if status.Code(dup) != codes.Aborted || grpcerr.Reason(dup) != idemgate.ReasonInFlight {
				t.Fatalf("duplicate after the restart's grace: %v (%s); want ABORTED %s, the holder was alive", dup, grpcerr.Reason(dup), idemgate.ReasonInFlight)
			}

			svc.releaseHolder()
			first := <-holder
			if first.err != nil {
				t.Fatalf("the holder: %v", first.err)
			}
			want, err := proto.Marshal(first.resp)
			if err != nil {
				t.Fatal(err)
			}
			for _, tool := range []testingv1.ChaosServiceClient{otherTool, holderTool} {
				var header metadata.MD
				var again *testingv1.ChargeResponse
				for deadline := time.Now().Add(patience); ; time.Sleep(100 * time.Millisecond) {
					again, err = m.call(tool)(withKey("order-1"), req, grpc.Header(&header))
					if status.Code(err) != codes.Aborted && status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
						break
					}
				}
				got, _ := proto.Marshal(again)
				if err != nil || string(got) != string(want) || len(header.Get(idemgate.ReplayedHeader)) != 1 {
					t.Fatalf("duplicate after the holder's Finish: %v %v (header %v), want %v replayed", again, err, header, first.resp)
				}
			}
			if got := svc.executions.Load(); got != 1 {
				t.Fatalf("%d executions, want 1", got)
			}
		})
	}
}

// holdingCharges is a ChaosService whose first execution holds its key
// until released (or its context ends); later executions answer at once.
type holdingCharges struct {
	testingv1.UnimplementedChaosServiceServer
	executions atomic.Int64
	started    chan struct{}
	release    chan struct{}
	once       sync.Once
}

func (s *holdingCharges) releaseHolder() { s.once.Do(func() { close(s.release) }) }

func (s *holdingCharges) Charge(ctx context.Context, req *testingv1.ChargeRequest) (*testingv1.ChargeResponse, error) {
	return s.charge(ctx, req)
}

func (s *holdingCharges) ChargeReexecute(ctx context.Context, req *testingv1.ChargeRequest) (*testingv1.ChargeResponse, error) {
	return s.charge(ctx, req)
}

func (s *holdingCharges) charge(ctx context.Context, req *testingv1.ChargeRequest) (*testingv1.ChargeResponse, error) {
	n := s.executions.Add(1)
	token, _ := idemgate.FencingTokenFromContext(ctx)
	if n == 1 {
		close(s.started)
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return &testingv1.ChargeResponse{ChargeId: fmt.Sprintf("charge-%d", n), Action: req.GetAction(), Epoch: token.Epoch}, nil
}

// dialLog records when a tool server's connection attempts to the Dedupe
// service fail. It only watches: the dial is net.Dialer's, and when to try
// is left to grpc-go's backoff.
type dialLog struct {
	mu       sync.Mutex
	lastFail time.Time
}

func (d *dialLog) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		d.mu.Lock()
		d.lastFail = time.Now()
		d.mu.Unlock()
	}
	return conn, err
}

// waitFailureAfter waits for a connection attempt that failed after at.
func (d *dialLog) waitFailureAfter(t *testing.T, at time.Time) {
	t.Helper()
	for deadline := at.Add(patience); ; time.Sleep(20 * time.Millisecond) {
		d.mu.Lock()
		last := d.lastFail
		d.mu.Unlock()
		if last.After(at) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed connection attempt after %v", at)
		}
	}
}

// readmeTool serves svc gated by a Gate built as docs/gating.md's "Register the
// interceptor" shows: grpc-go's default reconnect backoff, the Dedupe
// service config, WithDedupeConn and WatchDedupe. dial, when set, only
// watches the connection attempts.
func readmeTool(t *testing.T, addr string, svc testingv1.ChaosServiceServer, dial func(context.Context, string) (net.Conn, error)) (testingv1.ChaosServiceClient, *interceptor.Gate) {
	t.Helper()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig),
	}
	if dial != nil {
		opts = append(opts, grpc.WithContextDialer(dial))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), interceptor.WithDedupeConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); gate.WatchDedupe(ctx, health.NewServer()) }()
	t.Cleanup(func() {
		cancel()
		<-done
		closeCtx, cancelClose := context.WithTimeout(context.Background(), patience)
		defer cancelClose()
		_ = gate.Close(closeCtx)
	})
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	testingv1.RegisterChaosServiceServer(srv, svc)
	return testingv1.NewChaosServiceClient(stacktest.Serve(t, srv)), gate
}
