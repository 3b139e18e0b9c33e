package embedded_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc/embedded"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A gate over the embedded service on PostgreSQL runs a side effect once
// for 16 concurrent calls with one key, and every call that is answered
// gets that one charge.
func TestGateOverEmbeddedServiceDeduplicatesConcurrentCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc, err := embedded.Start(ctx, embedded.Config{DatabaseURL: pgtest.SchemaURL(t), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	gate, err := interceptor.New(svc.Client(), interceptor.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ledger := &payments.Ledger{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(gate.UnaryServerInterceptor()))
	paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: ledger})
	client := paymentsv1.NewPaymentsServiceClient(stacktest.Serve(t, srv))
	if err := gate.CheckDedupe(ctx); err != nil {
		t.Fatalf("CheckDedupe through the embedded client: %v", err)
	}

	keyed := metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "order-embedded-1")
	const callers = 16
	ids := make([]string, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			resp, err := client.ChargeCard(keyed, &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 100})
			if err != nil {
				// A duplicate that waited past its max_wait is told to retry.
				if status.Code(err) != codes.Aborted {
					t.Errorf("caller %d: %v", i, err)
				}
				return
			}
			ids[i] = resp.GetChargeId()
		})
	}
	close(start)
	wg.Wait()
	if charges := ledger.Charges(); len(charges) != 1 {
		t.Fatalf("%d charges for one key, want 1: %+v", len(charges), charges)
	}
	want := ledger.Charges()[0].ID
	for i, id := range ids {
		if id != "" && id != want {
			t.Errorf("caller %d got charge %s, want the one charge, %s", i, id, want)
		}
	}
	srv.Stop()
	if err := gate.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// backgroundFrames are the functions of the service's background work and
// its store: none may run once Close returns.
var backgroundFrames = []string{
	"idemgate/idemgate/dedupesvc.", "idemgate/idemgate/dedupesvc/pgstore.", "idemgate/idemgate/internal/dedupeapp.", "jackc/pgx/",
}

// otherGoroutines are the stacks of every goroutine but the caller's that
// run one of frames.
func otherGoroutines(frames []string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := strings.Split(string(buf), "\n\n")
	var found []string
	for _, s := range stacks[1:] { // the first is this goroutine's
		for _, f := range frames {
			if strings.Contains(s, f) {
				found = append(found, s)
				break
			}
		}
	}
	return found
}

// Close stops the sweeper, the usage compaction, the replay-count flushes
// and the NOTIFY listener, and closes the pool, before it returns: no
// goroutine of theirs is left. Not parallel: another test's service would
// show the same frames.
func TestCloseStopsTheBackgroundWork(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.SchemaURL(t)
	poolGoroutines := len(otherGoroutines([]string{"jackc/pgx/"})) // pgtest's own pool's
	svc, err := embedded.Start(ctx, embedded.Config{DatabaseURL: dbURL, Logger: quietLogger(),
		SweepInterval: 20 * time.Millisecond, UsageCompactionInterval: 10 * time.Millisecond, ReplayFlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			svc.Close()
		}
	}()
	client := svc.Client()
	fp := sha256.Sum256([]byte("r"))
	begin := func(token string) (*idemgatev1.BeginResponse, error) {
		return client.Begin(ctx, &idemgatev1.BeginRequest{Scope: "/pkg.S/M", Key: "k1", Fingerprint: fp[:], AttemptToken: token,
			Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)})
	}
	res, err := begin("t1")
	if err != nil || res.GetReserved() == nil {
		t.Fatalf("Begin: %v, %v; want reserved", res, err)
	}
	if _, err := client.Finish(ctx, &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "k1", AttemptToken: "t1", Epoch: res.GetReserved().GetEpoch(),
		Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	if res, err := begin("t2"); err != nil || res.GetCompleted() == nil {
		t.Fatalf("second Begin: %v, %v; want the replay", res, err)
	}
	running := strings.Join(otherGoroutines(backgroundFrames), "\n\n")
	for _, f := range []string{"(*Sweeper).Run", "RunUsageCompaction", "(*ReplayRecorder).Run", "(*Listener).Run"} {
		if !strings.Contains(running, f) {
			t.Errorf("before Close no goroutine runs %s: the check below would prove nothing\n%s", f, running)
		}
	}
	svc.Close()
	closed = true
	if left := otherGoroutines(backgroundFrames[:3]); len(left) > 0 {
		t.Errorf("%d goroutines of the service left after Close:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	// pgxpool's Close signals its health check to end and does not wait
	// for it: it goes on its own, soon (this bound is no timing assertion).
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		left := otherGoroutines(backgroundFrames[3:])
		if len(left) <= poolGoroutines {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of the pool left a minute after Close, %d before Start:\n%s", len(left), poolGoroutines, strings.Join(left, "\n\n"))
		}
	}
	svc.Close() // a second Close returns at once
	if _, err := begin("t3"); status.Code(err) != codes.Unavailable {
		t.Errorf("Begin after Close: %v, want UNAVAILABLE", err)
	}
}

// Every setting Start refuses is named by its field, and all are reported
// at once.
func TestStartNamesTheFieldsItRefuses(t *testing.T) {
	t.Parallel()
	_, err := embedded.Start(context.Background(), embedded.Config{DataDir: t.TempDir(), Logger: quietLogger(),
		SweepInterval: -time.Second, CallerBeginBurst: -1, MaxRetention: 400 * 24 * time.Hour, UsageCompactionInterval: time.Millisecond})
	if err == nil {
		t.Fatal("Start accepted negative and out-of-range settings")
	}
	for _, want := range []string{"embedded.Config.SweepInterval", "embedded.Config.CallerBeginBurst", "embedded.Config.MaxRetention", "embedded.Config.UsageCompactionInterval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start: %v\ndoes not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "-sweep-interval") {
		t.Errorf("Start: %v\nnames a flag, not the field", err)
	}
	_, err = embedded.Start(context.Background(), embedded.Config{DatabaseURL: "postgres://postgres@127.0.0.1:1/x?connect_timeout=5", Logger: quietLogger()})
	if err == nil || !strings.Contains(err.Error(), "embedded.Config.DatabaseURL: connect to") {
		t.Errorf("Start on an unreachable database: %v, want it to name embedded.Config.DatabaseURL", err)
	}
}

// The caller limits apply to the process's calls, and Unlimited turns them
// off (TestZeroConfigIsDedupesvcsDefaults checks the defaults).
func TestCallerLimitsTakeTheDefaultsAndUnlimited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	beginUntilRefused := func(cfg embedded.Config, upTo int) int {
		svc, err := embedded.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer svc.Close()
		fp := sha256.Sum256([]byte("r"))
		for i := range upTo {
			_, err := svc.Client().Begin(ctx, &idemgatev1.BeginRequest{Scope: "/pkg.S/M", Key: "k", Fingerprint: fp[:], AttemptToken: "t",
				Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)})
			if status.Code(err) == codes.ResourceExhausted {
				return i
			}
		}
		return upTo
	}
	if n := beginUntilRefused(embedded.Config{DataDir: t.TempDir(), Logger: quietLogger(), CallerBeginRate: 0.001, CallerBeginBurst: 3}, 10); n != 3 {
		t.Errorf("CallerBeginBurst 3: %d Begins before a refusal, want 3", n)
	}
	if n := beginUntilRefused(embedded.Config{DataDir: t.TempDir(), Logger: quietLogger(), CallerBeginRate: embedded.Unlimited, CallerBeginBurst: 1}, 50); n != 50 {
		t.Errorf("CallerBeginRate Unlimited: refused after %d Begins", n)
	}
}

// The service's own metrics go to Registerer, and Close takes them out.
func TestRegistererGetsTheServicesMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cfg := embedded.Config{DataDir: t.TempDir(), Logger: quietLogger(), Registerer: reg}
	svc, err := embedded.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	joined := strings.Join(names, " ")
	if !strings.Contains(joined, "idemgate_dedupe_") || strings.Contains(joined, "go_goroutines") {
		t.Errorf("Registerer got %v; want idemgate_dedupe_* and not the Go runtime's", names)
	}
	svc.Close()
	// Unregistered: a second service registers the same metrics again.
	svc, err = embedded.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("a second Start on the same Registerer after Close: %v", err)
	}
	svc.Close()
}

// ParseFlags reads dedupesvc's flags and variables with their meaning: 0
// turns a caller limit off (Unlimited), and the gRPC server's flags are
// refused by name.
func TestParseFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://db/x", "IDEMGATE_SWEEP_INTERVAL": "5m"}
	cfg, err := embedded.ParseFlags("tool", []string{"-caller-begin-rate=0", "-migrate-on-start=false", "-notify=false"},
		cliflag.Map(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DatabaseURL != "postgres://db/x" || cfg.SweepInterval != 5*time.Minute || cfg.CallerBeginRate != embedded.Unlimited ||
		!cfg.SkipMigrations || !cfg.DisableNotify || cfg.CallerBeginBurst != 10000 || cfg.MetricsListen != "127.0.0.1:9464" {
		t.Errorf("ParseFlags: %+v", cfg)
	}
	if _, err := embedded.ParseFlags("tool", []string{"-token-file", "/x", "-reflection"}, cliflag.Map(nil), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "-token-file") || !strings.Contains(err.Error(), "-reflection") {
		t.Errorf("ParseFlags with -token-file and -reflection: %v, want both refused by name", err)
	}
	var usage bytes.Buffer
	if _, err := embedded.ParseFlags("tool", []string{"-h"}, cliflag.Map(nil), &usage); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(usage.String(), "-sweep-interval") {
		t.Errorf("ParseFlags -h: %v, usage %q", err, usage.String())
	}
}

// A Config selects its store: with neither DatabaseURL nor DataDir Start
// refused nothing and opened dedupesvc's own default data directory
// (~/.local/share/idemgate), a store another program may have left; with
// both it silently ignored DataDir (issue 41 item 4). Both are refused,
// naming the fields, and the embedded store's first log line names the
// field that selects PostgreSQL, not dedupesvc's DATABASE_URL, which Start
// never reads.
func TestStartNeedsOneStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  embedded.Config
		want string
	}{
		{"neither", embedded.Config{}, "set embedded.Config.DatabaseURL (PostgreSQL) or embedded.Config.DataDir"},
		{"both", embedded.Config{DatabaseURL: "postgres://postgres@127.0.0.1:1/x", DataDir: t.TempDir()}, "embedded.Config.DatabaseURL and embedded.Config.DataDir are both set"},
	} {
		tc.cfg.Logger = quietLogger()
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
		if svc, err := embedded.Start(context.Background(), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			if svc != nil {
				svc.Close()
			}
			t.Errorf("%s: Start = %v, want %q", tc.name, err, tc.want)
		}
	}
	var logs bytes.Buffer
	svc, err := embedded.Start(context.Background(), embedded.Config{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc.Close()
	if want := "set embedded.Config.DatabaseURL to use PostgreSQL"; !strings.Contains(logs.String(), want) || strings.Contains(logs.String(), "set DATABASE_URL") {
		t.Errorf("the embedded store's log:\n%s\nwant %q", logs.String(), want)
	}
}
