package dedupeapp_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://env/db", "IDEMGATE_SWEEP_INTERVAL": "30s", "HOME": "/home/u"}
	cfg, err := dedupeapp.ParseConfig("dedupesvc", []string{"-listen", "127.0.0.1:7000"}, cliflag.Map(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:7000" || cfg.DatabaseURL != "postgres://env/db" || cfg.SweepInterval != 30*time.Second ||
		!cfg.MigrateOnStart || cfg.SweepBatch != 1000 || cfg.ShutdownTimeout != 10*time.Second || cfg.LogLevel != slog.LevelInfo ||
		!cfg.Notify || cfg.PollInterval != 200*time.Millisecond || cfg.UnknownRetention != 168*time.Hour ||
		cfg.DataDir != "/home/u/.local/share/idemgate" {
		t.Fatalf("config %+v: flags, environment and defaults not applied", cfg)
	}
	if cfg.MaxConnections != 512 || cfg.MaxConcurrentStreams != 256 || cfg.HandshakeTimeout != 5*time.Second ||
		cfg.MaxConnectionIdle != 5*time.Minute || cfg.MaxConnectionAge != 30*time.Minute || cfg.MaxConnectionAgeGrace != 2*time.Minute ||
		cfg.KeepaliveMinTime != 10*time.Second || cfg.AuthRefusalLogRate != 1 || cfg.TokenReloadInterval != 5*time.Second || cfg.ResolveAdminOnly ||
		cfg.ReplayFlushInterval != time.Second {
		t.Fatalf("config %+v: the limits' defaults not applied", cfg)
	}
	limits := map[string]string{"IDEMGATE_MAX_CONCURRENT_STREAMS": "8", "IDEMGATE_RESOLVE_ADMIN_ONLY": "true", "IDEMGATE_TOKEN_FILE": "t", "IDEMGATE_REPLAY_FLUSH_INTERVAL": "250ms"}
	cfg, err = dedupeapp.ParseConfig("dedupesvc", []string{"-max-connection-idle", "1m"}, cliflag.Map(limits), io.Discard)
	if err != nil || cfg.MaxConcurrentStreams != 8 || !cfg.ResolveAdminOnly || cfg.MaxConnectionIdle != time.Minute || cfg.ReplayFlushInterval != 250*time.Millisecond {
		t.Fatalf("config %+v, %v: the limits' flags and environment not applied", cfg, err)
	}
	preauth := map[string]string{"IDEMGATE_TOKEN_FILE": "t", "IDEMGATE_AGENT_FORWARDERS": "tools-a, tools-b", "IDEMGATE_MAX_UNAUTHENTICATED_STREAMS": "3"}
	cfg, err = dedupeapp.ParseConfig("dedupesvc", []string{"-unauthenticated-timeout", "30s", "-max-unauthenticated-connections", "16"}, cliflag.Map(preauth), io.Discard)
	if err != nil || len(cfg.AgentForwarders) != 2 || cfg.AgentForwarders[1] != "tools-b" || cfg.MaxUnauthenticatedStreams != 3 ||
		cfg.UnauthenticatedTimeout != 30*time.Second || cfg.MaxUnauthenticatedConnections != 16 || cfg.MaxUnauthenticatedConnectionsPerIP != dedupeapp.DefaultMaxUnauthenticatedConnectionsPerIP {
		t.Fatalf("config %+v, %v: the pre-authentication limits' flags and environment not applied", cfg, err)
	}

	bad := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-data-dir", ""}, nil, "-data-dir"},
		{[]string{"-database-url", "x", "-sweep-batch", "0"}, nil, "-sweep-batch must be positive"},
		{[]string{"-database-url", "x", "-log-level", "loud"}, nil, "-log-level"},
		{[]string{"-database-url", "x"}, map[string]string{"IDEMGATE_SHUTDOWN_TIMEOUT": "soon"}, "IDEMGATE_SHUTDOWN_TIMEOUT"},
		{[]string{"-database-url", "x", "extra"}, nil, "unexpected argument"},
		{[]string{"-listen", "0.0.0.0:50051", "-token-file", "t"}, nil, "serve TLS"},
		{[]string{"-listen", "10.1.2.3:50051", "-tls-cert", "c", "-tls-key", "k"}, nil, "so callers authenticate"},
		{[]string{"-tls-client-ca", "ca.pem"}, nil, "-tls-client-ca needs -tls-cert"},
		{[]string{"-tls-cert", "c"}, nil, "go together"},
		{[]string{"-otlp-endpoint", "grpc://collector:4317"}, nil, "-otlp-endpoint"},
		{[]string{"-otlp-endpoint", "https://"}, nil, "-otlp-endpoint"},
		{nil, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector"}, "-otlp-endpoint"},
		{[]string{"-resolve-admin-only"}, nil, "-resolve-admin-only needs"},
		{[]string{"-max-concurrent-streams", "-1"}, nil, "-max-concurrent-streams must be positive"},
		{nil, map[string]string{"IDEMGATE_AUTH_REFUSAL_LOG_RATE": "fast"}, "IDEMGATE_AUTH_REFUSAL_LOG_RATE"},
		{[]string{"-replay-flush-interval", "-1s"}, nil, "-replay-flush-interval must be positive"},
		{[]string{"-max-unauthenticated-streams", "-1"}, nil, "-max-unauthenticated-streams must be positive"},
		{[]string{"-max-unauthenticated-connections-per-ip", "-1"}, nil, "-max-unauthenticated-connections-per-ip must be positive"},
		{nil, map[string]string{"IDEMGATE_UNAUTHENTICATED_TIMEOUT": "-1s"}, "-unauthenticated-timeout must be positive"},
		{[]string{"-agent-forwarders", "tools"}, nil, "-agent-forwarders needs"},
	}
	for _, tt := range bad {
		_, err := dedupeapp.ParseConfig("dedupesvc", tt.args, cliflag.Map(tt.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseConfig(%v, %v) = %v, want an error mentioning %q", tt.args, tt.env, err, tt.want)
		}
	}
	for _, endpoint := range []string{"https://collector.example:4317", "http://127.0.0.1:4317", "127.0.0.1:4317"} {
		if _, err := dedupeapp.ParseConfig("dedupesvc", []string{"-otlp-endpoint", endpoint}, cliflag.Map(nil), io.Discard); err != nil {
			t.Errorf("-otlp-endpoint %s: %v", endpoint, err)
		}
	}
	if _, err := dedupeapp.ParseConfig("dedupesvc", []string{"-h"}, cliflag.Map(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

func TestServeAnswersAndStopsGracefully(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]dedupeapp.Config{
		"postgres": {DatabaseURL: pgtest.SchemaURL(t), MigrateOnStart: true},
		"embedded": {DataDir: t.TempDir()},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg.SweepInterval, cfg.SweepBatch, cfg.ShutdownTimeout = time.Minute, 100, 5*time.Second
			cfg.Notify, cfg.PollInterval, cfg.UnknownRetention, cfg.MaxOutcomeBytes = true, 100*time.Millisecond, time.Hour, 1<<20
			cfg.MetricsListen = stacktest.FreeAddr(t)
			serveAndStop(t, cfg)
		})
	}
}

func serveAndStop(t *testing.T, cfg dedupeapp.Config) {
	addr, stop := stacktest.StartApp(t, cfg)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(conn).Check(callCtx, &healthpb.HealthCheckRequest{Service: "idemgate.v1.DedupeService"}, grpc.WaitForReady(true))
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", h, err)
	}
	fp := sha256.Sum256([]byte("r"))
	res, err := idemgatev1.NewDedupeServiceClient(conn).Begin(callCtx, &idemgatev1.BeginRequest{
		Scope: "/x.S/M", Key: "k", Fingerprint: fp[:], AttemptToken: "a",
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour),
	})
	if err != nil || res.GetReserved() == nil {
		t.Fatalf("Begin = %v, %v; want reserved", res, err)
	}

	metrics := getMetrics(t, cfg.MetricsListen)
	for _, want := range []string{`idemgate_dedupe_outcomes_total{outcome="reserved"} 1`, `grpc_server_handled_total{grpc_code="OK",grpc_method="Begin",grpc_service="idemgate.v1.DedupeService",grpc_type="unary"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	served := make(chan error, 1)
	go func() { served <- stop() }()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve returned %v after a clean stop", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop within 10s of its context ending")
	}
}

func getMetrics(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d, %v", resp.StatusCode, err)
	}
	return string(body)
}

func TestServeWithTokensRefusesStrangers(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("payments client payments-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokens, Reflection: true})

	call := func(opts ...grpc.DialOption) error {
		conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fp := sha256.Sum256([]byte("r"))
		callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = idemgatev1.NewDedupeServiceClient(conn).Begin(callCtx, &idemgatev1.BeginRequest{
			Scope: "/x.S/M", Key: "k", Fingerprint: fp[:], AttemptToken: "a", Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour),
		}, grpc.WaitForReady(true))
		return err
	}
	if err := call(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v, want UNAUTHENTICATED", err)
	}
	if err := call(grpc.WithPerRPCCredentials(auth.BearerToken("payments-secret-0123456789", true))); err != nil {
		t.Fatalf("with the token: %v", err)
	}

	// Streams are authenticated too: server reflection refuses a stranger.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err == nil {
		_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("reflection without a token: %v, want UNAUTHENTICATED", err)
	}
}

// On shutdown, health turns NOT_SERVING first, and a call in flight still
// gets its answer.
func TestShutdownTurnsHealthFirstAndDrains(t *testing.T) {
	t.Parallel()
	addr, stop := stacktest.StartApp(t, dedupeapp.Config{DataDir: t.TempDir(), ShutdownTimeout: 10 * time.Second, PollInterval: 50 * time.Millisecond})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	dedupe := idemgatev1.NewDedupeServiceClient(conn)
	bg := context.Background()
	fp := sha256.Sum256([]byte("r"))
	begin := func(token string, wait time.Duration) (*idemgatev1.BeginResponse, error) {
		return dedupe.Begin(bg, &idemgatev1.BeginRequest{Scope: "/x.S/M", Key: "k", Fingerprint: fp[:], AttemptToken: token,
			Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour), MaxWait: durationpb.New(wait)}, grpc.WaitForReady(true))
	}
	if _, err := begin("holder", 0); err != nil {
		t.Fatal(err)
	}

	watchCtx, cancelWatch := context.WithCancel(bg)
	defer cancelWatch()
	watch, err := healthpb.NewHealthClient(conn).Watch(watchCtx, &healthpb.HealthCheckRequest{Service: "idemgate.v1.DedupeService"})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", first, err)
	}

	type answer struct {
		res *idemgatev1.BeginResponse
		err error
		at  time.Time
	}
	waiter := make(chan answer, 1)
	go func() { res, err := begin("waiter", 2*time.Second); waiter <- answer{res, err, time.Now()} }()
	time.Sleep(300 * time.Millisecond) // the waiter is in flight
	served := make(chan error, 1)
	go func() { served <- stop() }()

	next, err := watch.Recv()
	if err != nil || next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after shutdown began = %v, %v; want NOT_SERVING", next, err)
	}
	notServingAt := time.Now()
	cancelWatch()
	got := <-waiter
	if got.err != nil || got.res.GetInFlight() == nil {
		t.Fatalf("the in-flight call: %v, %v; want its answer (still in flight) despite the shutdown", got.res, got.err)
	}
	if got.at.Before(notServingAt) {
		t.Fatal("the in-flight call ended before health turned NOT_SERVING")
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// beginOnce makes one Begin on the dedupe service at addr, which may still be
// starting.
func beginOnce(t *testing.T, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fp := sha256.Sum256([]byte("r"))
	if _, err := idemgatev1.NewDedupeServiceClient(conn).Begin(context.Background(), &idemgatev1.BeginRequest{
		Scope: "/x.S/M", Key: "k", Fingerprint: fp[:], AttemptToken: "a", Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour),
	}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
}

func TestTracingWhenConfigured(t *testing.T) {
	t.Parallel()
	recorder := tracetest.NewSpanRecorder()
	cfg := dedupeapp.Config{DataDir: t.TempDir(), SweepInterval: time.Minute, SweepBatch: 100, ShutdownTimeout: 5 * time.Second,
		PollInterval: 100 * time.Millisecond, UnknownRetention: time.Hour, MaxOutcomeBytes: 1 << 20,
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))}
	beginOnce(t, stacktest.ServeApp(t, cfg))
	// The server span ends just after the response is sent: give it a moment.
	var names []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		names = names[:0]
		for _, s := range recorder.Ended() {
			names = append(names, s.Name())
		}
		if slices.Contains(names, "idemgate.v1.DedupeService/Begin") {
			return
		}
	}
	t.Fatalf("spans %v, want one for Begin", names)
}

// collector is a fake OpenTelemetry collector: it keeps the names of the
// spans exported to it.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []string
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, span := range ss.GetSpans() {
				c.spans = append(c.spans, span.GetName())
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// The exporter built from -otlp-endpoint delivers spans, for both plaintext
// forms of the endpoint; the service flushes them when it stops.
func TestTracingExportsToAnOTLPCollector(t *testing.T) {
	t.Parallel()
	for _, form := range []string{"host:port", "http://host:port"} {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			received := &collector{}
			srv := grpc.NewServer()
			coltracepb.RegisterTraceServiceServer(srv, received)
			conn := stacktest.Serve(t, srv) // the collector's address is conn.Target()
			endpoint := conn.Target()
			if form == "http://host:port" {
				endpoint = "http://" + endpoint
			}
			addr, stop := stacktest.StartApp(t, dedupeapp.Config{DataDir: t.TempDir(), OTLPEndpoint: endpoint})
			beginOnce(t, addr)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			received.mu.Lock()
			defer received.mu.Unlock()
			if !slices.Contains(received.spans, "idemgate.v1.DedupeService/Begin") {
				t.Fatalf("the collector received spans %v, want one for Begin", received.spans)
			}
		})
	}
}

// TestServeMarksTheStoreResumed: a starting service has been away, so it
// marks the store resumed, granting every in-flight lease one more lease.
func TestServeMarksTheStoreResumed(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	var before time.Time
	if err := pool.QueryRow(context.Background(), `SELECT resumed_at FROM idemgate_store_state`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(pgtest.URL(), "?") {
		sep = "&"
	}
	cfg := dedupeapp.Config{DatabaseURL: pgtest.URL() + sep + "search_path=" + schema}
	cfg.SweepInterval, cfg.SweepBatch, cfg.ShutdownTimeout = time.Minute, 100, 5*time.Second
	cfg.PollInterval, cfg.UnknownRetention, cfg.MaxOutcomeBytes = 100*time.Millisecond, time.Hour, 1<<20
	addr, stop := stacktest.StartApp(t, cfg)
	defer func() { _ = stop() }()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(callCtx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	var after time.Time
	if err := pool.QueryRow(context.Background(), `SELECT resumed_at FROM idemgate_store_state`).Scan(&after); err != nil || !after.After(before) {
		t.Fatalf("resumed_at %v after the start, %v before (%v); want it moved to the start", after, before, err)
	}
}
