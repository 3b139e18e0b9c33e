package main_test

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// waitFor polls cond until it holds; the deadline only bounds a hung test.
func waitFor(t *testing.T, what string, p *proctest.Process, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %s in vain; payments-server log:\n%s", what, p.Log())
		}
	}
}

// What the operator sees of a tool server whose Dedupe service is not
// there yet, then comes, then goes: the start-up check's warning, a log line
// for failing gated calls, and idemgate.dedupe health following it while the
// server itself stays SERVING.
func TestPaymentsServerReportsItsDedupeService(t *testing.T) {
	dedupeAddr, toolAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	tool := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/payments-server"),
		[]string{"-listen", toolAddr, "-dedupe", dedupeAddr}, nil)
	tool.WaitTCP(t, toolAddr, 2*time.Minute)
	conn, err := grpc.NewClient(toolAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	health := healthpb.NewHealthClient(conn)
	healthOf := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health of %q: %v", service, err)
		}
		return resp.GetStatus()
	}

	waitFor(t, "the start-up check's warning", tool, func() bool {
		return strings.Contains(tool.Log(), "does not serve this tool server yet")
	})
	if got := healthOf(idemgate.DedupeHealthService); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("idemgate.dedupe = %v without a Dedupe service, want NOT_SERVING", got)
	}
	if got := healthOf(""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("the server's health = %v, want SERVING", got)
	}
	keyed := metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "order-1")
	_, err = paymentsv1.NewPaymentsServiceClient(conn).ChargeCard(keyed, &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 100})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("ChargeCard without a Dedupe service: %v, want UNAVAILABLE", err)
	}
	waitFor(t, "the failing Dedupe RPC's log line", tool, func() bool {
		for _, line := range strings.Split(tool.Log(), "\n") {
			if strings.Contains(line, "a Dedupe service RPC failed") && strings.Contains(line, "dedupe="+dedupeAddr) &&
				strings.Contains(line, "rpc=Begin") && strings.Contains(line, "code=Unavailable") {
				return true
			}
		}
		return false
	})

	dedupe := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/dedupesvc"),
		[]string{"-listen", dedupeAddr, "-data-dir", filepath.Join(t.TempDir(), "data"), "-metrics-listen", ""}, []string{"DATABASE_URL="})
	waitFor(t, "idemgate.dedupe SERVING", tool, func() bool {
		return healthOf(idemgate.DedupeHealthService) == healthpb.HealthCheckResponse_SERVING
	})
	if _, err := paymentsv1.NewPaymentsServiceClient(conn).ChargeCard(keyed, &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 100}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("ChargeCard with the Dedupe service up: %v", err)
	}

	if err := dedupe.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "idemgate.dedupe NOT_SERVING", tool, func() bool {
		return healthOf(idemgate.DedupeHealthService) == healthpb.HealthCheckResponse_NOT_SERVING
	})
}
