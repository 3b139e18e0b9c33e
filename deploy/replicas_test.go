package deploy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

// begins is how many Dedupe RPCs (Begin, Finish, ...) a replica answered
// OK, from its /metrics. (round_robin picks per RPC, so a tool server's
// Begin and Finish of one call may go to different replicas: counting
// Begins alone can see one replica get them all.)
func begins(t *testing.T, metricsAddr string) int {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0
	for _, m := range regexp.MustCompile(`grpc_server_handled_total\{grpc_code="OK",grpc_method="[A-Za-z]+",grpc_service="idemgate\.v1\.DedupeService",[^}]*\} (\d+)`).FindAllSubmatch(b, -1) {
		v, _ := strconv.Atoi(string(m[1]))
		n += v
	}
	return n
}

// A tool server reaching two Dedupe service replicas on one database
// through one name, as docs/operating.md says (the address list comes from
// a resolver: DNS in production, a manual one here, since this machine has
// no name with two addresses): with DedupeServiceConfig's round_robin both
// replicas answer Begins; with one replica killed, every call still runs
// once per key, and the outcomes the killed replica stored replay from the
// other.
func TestToolServerReachesSeveralReplicas(t *testing.T) {
	bin := proctest.Build(t, "github.com/idemgate/idemgate/cmd/dedupesvc")
	database := pgtest.SchemaURL(t)
	type replica struct {
		p             *proctest.Process
		addr, metrics string
	}
	var replicas []replica
	var addrs []resolver.Address
	for range 2 {
		r := replica{addr: stacktest.FreeAddr(t), metrics: stacktest.FreeAddr(t)}
		r.p = proctest.Start(t, bin, []string{"-listen", r.addr, "-metrics-listen", r.metrics}, []string{"DATABASE_URL=" + database})
		r.p.WaitTCP(t, r.addr, 2*time.Minute)
		replicas = append(replicas, r)
		addrs = append(addrs, resolver.Address{Addr: r.addr})
	}
	names := manual.NewBuilderWithScheme("replicas")
	names.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient(names.Scheme()+":///dedupe.internal:50051", grpc.WithResolvers(names),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), interceptor.WithDedupeConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	svc := &testsvc.Server{}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	testingv1.RegisterTestServiceServer(srv, svc)
	client := testingv1.NewTestServiceClient(stacktest.Serve(t, srv))

	// call sends one keyed call, retried with its key on UNAVAILABLE as a
	// caller does (a Begin caught on the replica as it dies).
	call := func(key string) *testingv1.MutateResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key)
		for attempt := 0; ; attempt++ {
			res, err := client.Mutate(ctx, &testingv1.MutateRequest{Payload: key})
			if err == nil {
				return res
			}
			if status.Code(err) != codes.Unavailable || attempt == 5 {
				t.Fatalf("call %s: %v", key, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// Calls until both replicas have answered: round_robin uses a
	// replica once its connection is up, and a starved machine may take a
	// while to bring the second up. Bounded by calls, not by time.
	first := map[string]int64{}
	spread := func() bool { return begins(t, replicas[0].metrics) > 0 && begins(t, replicas[1].metrics) > 0 }
	for i := 0; i < 20 || !spread(); i++ {
		if i == 500 {
			t.Fatalf("500 calls and the Dedupe RPCs went to one replica (%d, %d): they do not spread (round_robin)",
				begins(t, replicas[0].metrics), begins(t, replicas[1].metrics))
		}
		key := fmt.Sprintf("before-%d", i)
		first[key] = call(key).GetExecution()
	}
	t.Logf("Dedupe RPCs answered: %d and %d", begins(t, replicas[0].metrics), begins(t, replicas[1].metrics))

	replicas[0].p.Kill()
	for key, execution := range first {
		if got := call(key).GetExecution(); got != execution {
			t.Errorf("%s after a replica died: execution %d, want the replay of %d", key, got, execution)
		}
	}
	for i := range 20 {
		call(fmt.Sprintf("after-%d", i))
	}
	if n, want := svc.Executions(), int64(len(first)+20); n != want {
		t.Errorf("executions = %d for %d keys, want %d", n, want, want)
	}
}
