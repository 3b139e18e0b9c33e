package main_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/stacktest"
)

// The real binary, with no DATABASE_URL, serves from the embedded store, and
// a gated call through it deduplicates.
func TestBinaryServesFromTheEmbeddedStore(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "dedupesvc")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	addr := stacktest.FreeAddr(t)
	cmd := exec.Command(bin, "-listen", addr, "-data-dir", filepath.Join(dir, "data"), "-metrics-listen", stacktest.FreeAddr(t))
	for _, kv := range os.Environ() { // as on a machine with no DATABASE_URL
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()

	first := <-lines
	want := filepath.Join(dir, "data", "dedupe.db")
	if !strings.Contains(first, "store=sqlite") || !strings.Contains(first, want) {
		t.Fatalf("first log line %q, want it to name the embedded store and %s", first, want)
	}
	go func() {
		for range lines { // keep the pipe drained
		}
	}()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(interceptor.DedupeServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "idemgate.v1.DedupeService"}, grpc.WaitForReady(true)); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", h, err)
	}

	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn))
	if err != nil {
		t.Fatal(err)
	}
	ledger := &payments.Ledger{}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: ledger})
	client := paymentsv1.NewPaymentsServiceClient(stacktest.Serve(t, srv))
	keyed := metadata.AppendToOutgoingContext(ctx, interceptor.KeyHeader, "order-8842")
	req := &paymentsv1.ChargeCardRequest{CustomerId: "cust_17", AmountCents: 4200}
	first1, err := client.ChargeCard(keyed, req)
	if err != nil {
		t.Fatal(err)
	}
	second, err := client.ChargeCard(keyed, req)
	if err != nil || second.GetChargeId() != first1.GetChargeId() || len(ledger.Charges()) != 1 {
		t.Fatalf("retry: %v, %v, %d charges; want the replay and one charge", second, err, len(ledger.Charges()))
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("dedupesvc exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("dedupesvc did not stop within 20s of SIGTERM")
	}
}
