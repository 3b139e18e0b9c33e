//go:build faults

// The real-process tests build cmd/dedupesvc (a second, non-race compile of
// every dependency) and start real processes and PostgreSQL clusters: they
// run in `make faults`, which CI runs, not in `make test`.

package main_test

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

const dedupesvcPkg = "github.com/idemgate/idemgate/cmd/dedupesvc"

// The real binary, with no DATABASE_URL, serves from the embedded store, and
// a gated call through it deduplicates.
func TestBinaryServesFromTheEmbeddedStore(t *testing.T) {
	dir := t.TempDir()
	addr := stacktest.FreeAddr(t)
	// DATABASE_URL= as on a machine with no DATABASE_URL: empty is unset.
	p := proctest.Start(t, proctest.Build(t, dedupesvcPkg),
		[]string{"-listen", addr, "-data-dir", filepath.Join(dir, "data"), "-metrics-listen", stacktest.FreeAddr(t)},
		[]string{"DATABASE_URL="})

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Generous: the binary starts inside this deadline on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
	keyed := metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "order-8842")
	req := &paymentsv1.ChargeCardRequest{CustomerId: "cust_17", AmountCents: 4200}
	first, err := client.ChargeCard(keyed, req)
	if err != nil {
		t.Fatal(err)
	}
	second, err := client.ChargeCard(keyed, req)
	if err != nil || second.GetChargeId() != first.GetChargeId() || len(ledger.Charges()) != 1 {
		t.Fatalf("retry: %v, %v, %d charges; want the replay and one charge", second, err, len(ledger.Charges()))
	}

	// The store is chosen before the service serves, so the health check
	// above has waited for the line: the first after the version's.
	lines := strings.SplitN(p.Log(), "\n", 3)
	want := filepath.Join(dir, "data", "dedupe.db")
	if len(lines) < 2 || !strings.Contains(lines[0], `msg="dedupesvc starting" version=`) ||
		!strings.Contains(lines[1], "store=sqlite") || !strings.Contains(lines[1], want) {
		t.Fatalf("log %q, want the version, then a line naming the embedded store and %s", lines, want)
	}

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(time.Minute); err != nil {
		t.Fatalf("dedupesvc exited with %v after SIGTERM, want 0", err)
	}
}
