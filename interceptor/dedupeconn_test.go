package interceptor_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testlog"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

// logBuffer collects JSON log lines from any goroutine.
type logBuffer struct{ testlog.Buffer }

// lines returns the log lines whose message contains msg.
func (b *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var found []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m, _ := rec["msg"].(string); strings.Contains(m, msg) {
			found = append(found, rec)
		}
	}
	return found
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

const failedLine = "a Dedupe service RPC failed"

// fakeDedupe is a Dedupe service that refuses every call with refusal, or,
// with none, answers a Heartbeat as a working service answers the probe
// (not held).
type fakeDedupe struct {
	idemgatev1.UnimplementedDedupeServiceServer
	refusal atomic.Pointer[status.Status]
}

func (f *fakeDedupe) Begin(context.Context, *idemgatev1.BeginRequest) (*idemgatev1.BeginResponse, error) {
	if r := f.refusal.Load(); r != nil {
		return nil, r.Err()
	}
	return nil, status.Error(codes.Unavailable, "store down")
}

func (f *fakeDedupe) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest) (*idemgatev1.HeartbeatResponse, error) {
	if r := f.refusal.Load(); r != nil {
		return nil, r.Err()
	}
	return nil, status.Error(codes.FailedPrecondition, "the reservation is not held by this attempt")
}

// serveFake serves f on addr ("127.0.0.1:0" for any port) until the
// returned server is stopped.
func serveFake(t *testing.T, addr string, f *fakeDedupe) (*grpc.Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return srv, lis.Addr().String()
}

// gatedTool serves the test service behind gate and returns its client.
func gatedTool(t *testing.T, gate *interceptor.Gate) testingv1.TestServiceClient {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	testingv1.RegisterTestServiceServer(srv, &testsvc.Server{})
	return testingv1.NewTestServiceClient(stacktest.Serve(t, srv))
}

func dialDedupe(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig),
		// Quick reconnects: the test waits for them, never times them.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: 500 * time.Millisecond}, MinConnectTimeout: 5 * time.Second}),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func errorInfo(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	t.Fatalf("%v carries no ErrorInfo", err)
	return nil
}

// A tool server whose Dedupe service is not there says so: one log line
// naming the address, the RPC, the code and the transport's message (the
// repeats are counted, not logged), and CheckDedupe fails with UNAVAILABLE.
func TestUnreachableDedupeIsLogged(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	conn := dialDedupe(t, addr)
	var logs logBuffer
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), interceptor.WithDedupeConn(conn),
		interceptor.WithLogger(logs.logger()), interceptor.WithDedupeFailureLogInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The re-sent Begins would go on for the retry budget.
		stopped, stop := context.WithCancel(context.Background())
		stop()
		gate.Close(stopped)
	})
	tool := gatedTool(t, gate)
	for _, key := range []string{"k1", "k2", "k3"} {
		_, err := tool.Mutate(withKey(key), &testingv1.MutateRequest{Payload: "charge"})
		wantStatus(t, err, codes.Unavailable, idemgate.ReasonStoreUnavailable)
	}
	lines := logs.lines(t, failedLine)
	if len(lines) != 1 {
		t.Fatalf("%d failure lines, want 1 (the repeats counted):\n%s", len(lines), logs.String())
	}
	line := lines[0]
	if line["level"] != "ERROR" || line["dedupe"] != addr || line["rpc"] != "Begin" || line["code"] != "Unavailable" ||
		!strings.Contains(line["message"].(string), addr) {
		t.Errorf("failure line %v, want ERROR with dedupe=%s, rpc=Begin, code=Unavailable and the transport's message", line, addr)
	}

	err = gate.CheckDedupe(context.Background())
	wantStatus(t, err, codes.Unavailable, idemgate.ReasonStoreUnavailable)
	if info := errorInfo(t, err); info.GetMetadata()["dedupe"] != addr || info.GetMetadata()["dedupe_code"] != "Unavailable" {
		t.Errorf("CheckDedupe ErrorInfo metadata %v, want dedupe=%s and dedupe_code=Unavailable", info.GetMetadata(), addr)
	}
}

// A Dedupe service that refuses the tool server's credentials is logged
// with its code and message, never with the credentials.
func TestRefusingDedupeIsLogged(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-token-do-not-log"
	for _, code := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			fake := &fakeDedupe{}
			fake.refusal.Store(status.New(code, "the bearer token is not one this service accepts"))
			_, addr := serveFake(t, "127.0.0.1:0", fake)
			conn := dialDedupe(t, addr, grpc.WithPerRPCCredentials(auth.BearerToken(secret, true)))
			var logs logBuffer
			gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), interceptor.WithDedupeConn(conn), interceptor.WithLogger(logs.logger()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { gate.Close(context.Background()) })

			err = gate.CheckDedupe(context.Background())
			wantStatus(t, err, codes.Internal, idemgate.ReasonStoreRejected)
			if info := errorInfo(t, err); info.GetMetadata()["dedupe_code"] != code.String() || !strings.Contains(status.Convert(err).Message(), "not one this service accepts") {
				t.Errorf("CheckDedupe: %v (metadata %v), want the service's code and message", err, info.GetMetadata())
			}

			_, err = gatedTool(t, gate).Mutate(withKey("k1"), &testingv1.MutateRequest{Payload: "charge"})
			wantStatus(t, err, codes.Internal, idemgate.ReasonStoreRejected)
			lines := logs.lines(t, failedLine)
			if len(lines) != 1 {
				t.Fatalf("%d failure lines, want 1:\n%s", len(lines), logs.String())
			}
			if line := lines[0]; line["code"] != code.String() || line["rpc"] != "Begin" || line["dedupe"] != addr ||
				line["message"] != "the bearer token is not one this service accepts" || !strings.Contains(line["hint"].(string), "-token-file") && code == codes.Unauthenticated {
				t.Errorf("failure line %v, want code %s, rpc Begin, the address, the service's message and a hint", line, code)
			}
			if strings.Contains(logs.String(), secret) {
				t.Errorf("the log carries the bearer token:\n%s", logs.String())
			}
		})
	}
}

// waitHealth waits until hs reports want for the Dedupe service; the
// deadline is only a bound on a hung test.
func waitHealth(t *testing.T, hs *health.Server, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: idemgate.DedupeHealthService})
		if err == nil && resp.GetStatus() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health of %s = %v, %v; want %v", idemgate.DedupeHealthService, resp.GetStatus(), err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The tool server's health for idemgate.dedupe turns NOT_SERVING when the
// Dedupe service goes away or refuses it, and SERVING again when it is back.
func TestDedupeHealthFollowsTheService(t *testing.T) {
	t.Parallel()
	fake := &fakeDedupe{}
	srv, addr := serveFake(t, "127.0.0.1:0", fake)
	conn := dialDedupe(t, addr)
	var logs logBuffer
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), interceptor.WithDedupeConn(conn), interceptor.WithLogger(logs.logger()))
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

	srv.Stop() // the Dedupe service goes away
	waitHealth(t, hs, healthpb.HealthCheckResponse_NOT_SERVING)
	if len(logs.lines(t, "NOT_SERVING")) == 0 {
		t.Errorf("no log line says the Dedupe service became unreachable:\n%s", logs.String())
	}

	serveFake(t, addr, fake) // and comes back on its address
	waitHealth(t, hs, healthpb.HealthCheckResponse_SERVING)

	// Reachable but refusing this tool server: not serving either, until
	// the service accepts it again (found by WatchDedupe's re-check).
	fake.refusal.Store(status.New(codes.PermissionDenied, "no"))
	if err := gate.CheckDedupe(context.Background()); err == nil {
		t.Fatal("CheckDedupe against a refusing service succeeded")
	}
	waitHealth(t, hs, healthpb.HealthCheckResponse_NOT_SERVING)
	fake.refusal.Store(nil)
	waitHealth(t, hs, healthpb.HealthCheckResponse_SERVING)
}

// The start-up check passes against a working Dedupe service: the probe
// gets through its authentication and validation and changes nothing, not
// even the service's outcome counters (a probe counted as a fenced renewal
// would fire IdemgateDedupeFenced on every deploy).
func TestCheckDedupeAgainstTheService(t *testing.T) {
	t.Parallel()
	store, err := sqlitestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	metrics := dedupesvc.NewMetrics()
	gate, err := interceptor.New(dedupesvc.NewInProcessClient(dedupesvc.NewServer(store, dedupesvc.WithMetrics(metrics))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gate.Close(context.Background()) })
	if err := gate.CheckDedupe(context.Background()); err != nil {
		t.Fatalf("CheckDedupe: %v", err)
	}
	records, err := store.ListRecords(context.Background(), dedupesvc.ListQuery{Limit: 10})
	if err != nil || len(records) != 0 {
		t.Errorf("after CheckDedupe the store holds %v (%v), want nothing", records, err)
	}
	// Every outcome stays at zero: a probe is no Dedupe outcome.
	want := `
# HELP idemgate_dedupe_outcomes_total Dedupe service answers by outcome.
# TYPE idemgate_dedupe_outcomes_total counter
idemgate_dedupe_outcomes_total{outcome="fenced"} 0
idemgate_dedupe_outcomes_total{outcome="finished"} 0
idemgate_dedupe_outcomes_total{outcome="in_flight"} 0
idemgate_dedupe_outcomes_total{outcome="invalid"} 0
idemgate_dedupe_outcomes_total{outcome="mismatched"} 0
idemgate_dedupe_outcomes_total{outcome="released"} 0
idemgate_dedupe_outcomes_total{outcome="replayed"} 0
idemgate_dedupe_outcomes_total{outcome="reserved"} 0
idemgate_dedupe_outcomes_total{outcome="resolved"} 0
idemgate_dedupe_outcomes_total{outcome="store_errors"} 0
idemgate_dedupe_outcomes_total{outcome="unknown"} 0
idemgate_dedupe_outcomes_total{outcome="waited"} 0
`
	if err := testutil.CollectAndCompare(metrics, strings.NewReader(want), "idemgate_dedupe_outcomes_total"); err != nil {
		t.Errorf("after CheckDedupe: %v", err)
	}
}

// A Dedupe service that comes back is reached as soon as a Dedupe RPC fails
// UNAVAILABLE, not when the connection's reconnect backoff would next try:
// this connection waits an hour between attempts, so only the Gate cutting
// the backoff (WithDedupeConn) can reconnect it while the test runs.
func TestFailingDedupeRPCsCutTheReconnectBackoff(t *testing.T) {
	t.Parallel()
	srv, addr := serveFake(t, "127.0.0.1:0", &fakeDedupe{})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: time.Hour, Multiplier: 1, MaxDelay: time.Hour}, MinConnectTimeout: 5 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var logs logBuffer
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), interceptor.WithDedupeConn(conn), interceptor.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := gate.CheckDedupe(ctx); err != nil {
		t.Fatalf("CheckDedupe against the service: %v", err)
	}
	srv.Stop()
	// The connection notices, fails to reconnect, and waits its hour.
	waitForDedupe(t, func() bool { return gate.CheckDedupe(ctx) != nil })
	serveFake(t, addr, &fakeDedupe{})
	waitForDedupe(t, func() bool { return gate.CheckDedupe(ctx) == nil })
}

// waitForDedupe polls cond until it holds, failing the test after a minute.
func waitForDedupe(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the condition did not hold within a minute")
		}
	}
}
