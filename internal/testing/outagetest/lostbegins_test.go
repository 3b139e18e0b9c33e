//go:build faults

package outagetest_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/netfault"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

// Many Begins reserve their keys at the real Dedupe service while their
// answers are lost (a fault proxy drops the service's replies to one tool
// server), then PostgreSQL crashes and stays down for longer than the lease;
// the service answers that tool server a quarter second late meanwhile.
// Once the store is back, the service grants every reservation one more
// lease, and the tool server's follow-up must re-send every lost Begin and
// release its key within it (eight at a time, as before issue 31, that took
// 150 × ½s / 8 = 9.4s, over two leases): a duplicate of each key through another tool server,
// retried until it gets a final answer, must run it (the lost Begins'
// handlers never ran), never get IDEMPOTENCY_OUTCOME_UNKNOWN (issue 31 item
// 2: 474 lost Begins queued, one key told outcome-unknown).
func TestManyLostBeginsAcrossASlowStoreRecoveryAreReleased(t *testing.T) {
	t.Parallel()
	const keys, lease = 150, 4 * time.Second // MutateHeld's lease
	bin := proctest.Build(t, dedupesvcPkg)
	cluster := pgtest.NewCluster(t)
	addr := stacktest.FreeAddr(t)
	svc := proctest.Start(t, bin, []string{"-listen", addr, "-metrics-listen=", "-database-url", cluster.URL("postgres")}, nil)
	svc.WaitTCP(t, addr, patience)
	proxy := netfault.NewProxy(t, addr)

	lossy := &testsvc.Server{}
	lossyClient, lossyGate := gatedToolOn(t, proxy.Addr(), lossy, interceptor.WithDedupeTimeout(time.Second))
	other := &testsvc.Server{}
	otherClient, _ := gatedToolOn(t, addr, other)
	key := func(i int) string { return fmt.Sprintf("lost-%d", i) }

	// Reserve every key with a Begin whose answer never comes back, on a
	// connection open before the fault (a new one would not get the
	// service's HTTP/2 preface, and its Begins would never be sent).
	if _, err := lossyClient.MutateHeld(withKey("warm-up"), &testingv1.MutateRequest{Payload: "charge"}); err != nil {
		t.Fatalf("warm-up call: %v", err)
	}
	proxy.DropReplies()
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			_, err := lossyClient.MutateHeld(withKey(key(i)), &testingv1.MutateRequest{Payload: "charge"})
			if grpcerr.Reason(err) != idemgate.ReasonStoreUnavailable {
				t.Errorf("call %d while its Begin's answer is lost: %v, want %s", i, err, idemgate.ReasonStoreUnavailable)
			}
		})
	}
	wg.Wait()
	if lossy.Executions() != 1 {
		t.Fatalf("%d handlers ran with their Begins' answers lost", lossy.Executions()-1)
	}
	// Each lost Begin reserved its key: a duplicate is told it is in flight.
	var reserved atomic.Int64
	for i := range keys {
		wg.Go(func() {
			_, err := otherClient.MutateHeld(withKey(key(i)), &testingv1.MutateRequest{Payload: "charge"})
			if grpcerr.Reason(err) == idemgate.ReasonInFlight {
				reserved.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d of %d lost Begins reserved their keys", reserved.Load(), keys)
	if reserved.Load() < keys/2 {
		t.Fatalf("only %d of %d lost Begins reached the service", reserved.Load(), keys)
	}
	// The store crashes for longer than the lease; the answers flow again
	// meanwhile, each a quarter second late (a service recovering under
	// load), so the follow-ups find the service, then the store, back, and
	// each takes at least half a second (its Begin, then its Release).
	cluster.Stop(t, "immediate")
	proxy.Heal()
	proxy.Latency(250 * time.Millisecond)
	time.Sleep(lease + 2*time.Second)
	cluster.Start(t)
	t.Logf("%d lost Begins (Stats %+v); PostgreSQL back", keys, lossyGate.Stats())

	var unknowns, ran atomic.Int64
	for i := range keys {
		wg.Go(func() {
			err := answerOnceBack(t, func() error {
				for deadline := time.Now().Add(patience); ; time.Sleep(100 * time.Millisecond) {
					_, err := otherClient.MutateHeld(withKey(key(i)), &testingv1.MutateRequest{Payload: "charge"})
					if grpcerr.Reason(err) != idemgate.ReasonInFlight || time.Now().After(deadline) {
						return err
					}
				}
			})
			switch {
			case err == nil:
				ran.Add(1)
			case grpcerr.Reason(err) == idemgate.ReasonOutcomeUnknown:
				unknowns.Add(1)
			default:
				t.Errorf("duplicate of %s through the other tool server: %v", key(i), err)
			}
		})
	}
	wg.Wait()
	t.Logf("duplicates through the other tool server: %d ran, %d told %s", ran.Load(), unknowns.Load(), idemgate.ReasonOutcomeUnknown)
	if unknowns.Load() != 0 {
		t.Errorf("%d of %d keys whose handler never ran were answered %s", unknowns.Load(), keys, idemgate.ReasonOutcomeUnknown)
	}
	if got := other.Executions(); got != ran.Load() {
		t.Errorf("%d executions for %d duplicates that ran", got, ran.Load())
	}
}

// gatedToolOn serves the test service gated by a Gate on the Dedupe service
// at addr, following its connection (WithDedupeConn), and returns a client
// of it and the Gate.
func gatedToolOn(t *testing.T, addr string, svc *testsvc.Server, opts ...interceptor.Option) (testingv1.TestServiceClient, *interceptor.Gate) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), append(opts, interceptor.WithDedupeConn(conn))...)
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
	return testingv1.NewTestServiceClient(stacktest.Serve(t, srv)), gate
}
