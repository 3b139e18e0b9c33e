package main_test

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The example tool server is the one adopters copy: it may use only what
// their module can import. internal/dedupeapp is the Dedupe service's own
// application; the example served its metrics through it.
func TestExampleDoesNotImportTheDedupeApp(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, imp := range strings.Fields(string(out)) {
		if imp == "github.com/idemgate/idemgate/internal/dedupeapp" {
			t.Errorf("payments-server imports %s, which an adopter's module cannot", imp)
		}
	}
}

// With -metrics-listen the binary serves the gate's metrics at /metrics: a
// charge refused for its missing key is counted there.
func TestMetricsAreServed(t *testing.T) {
	t.Parallel()
	dedupeAddr, toolAddr, metricsAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	tool := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/payments-server"),
		[]string{"-listen", toolAddr, "-dedupe", dedupeAddr, "-metrics-listen", metricsAddr}, nil)
	tool.WaitTCP(t, metricsAddr, 2*time.Minute)
	tool.WaitTCP(t, toolAddr, 2*time.Minute)
	conn, err := grpc.NewClient(toolAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = paymentsv1.NewPaymentsServiceClient(conn).ChargeCard(ctx, &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 500})
	if grpcerr.Reason(err) != idemgate.ReasonKeyMissing {
		t.Fatalf("a charge without a key: %v, want %s", err, idemgate.ReasonKeyMissing)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `idemgate_interceptor_calls_total{`) {
		t.Fatalf("GET /metrics: %s\n%.2000s\nlog:\n%s", resp.Status, body, tool.Log())
	}
}
