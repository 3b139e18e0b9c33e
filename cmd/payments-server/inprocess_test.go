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
	"google.golang.org/grpc/metadata"

	"github.com/idemgate/idemgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// With -dedupe in-process the binary is a whole stack: no Dedupe service
// runs, and a retried ChargeCard still charges once, from the embedded
// store the dedupesvc flags after -- name. Its records outlive the process,
// so after a restart the same key replays the first charge.
func TestPaymentsServerWithTheDedupeServiceInProcess(t *testing.T) {
	bin := proctest.Build(t, "github.com/idemgate/idemgate/cmd/payments-server")
	dataDir := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	keyed := metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "order-in-process")
	var first string
	for run := range 2 {
		addr := stacktest.FreeAddr(t)
		tool := proctest.Start(t, bin, []string{"-listen", addr, "-dedupe", "in-process", "--", "-data-dir", dataDir, "-metrics-listen="}, []string{"DATABASE_URL="})
		tool.WaitTCP(t, addr, 2*time.Minute)
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		client := paymentsv1.NewPaymentsServiceClient(conn)
		for try := range 2 {
			resp, err := client.ChargeCard(keyed, &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 100})
			if err != nil {
				t.Fatalf("run %d, try %d: %v\n%s", run, try, err, tool.Log())
			}
			if first == "" {
				first = resp.GetChargeId()
			} else if resp.GetChargeId() != first {
				t.Errorf("run %d, try %d: charge %s, want the first one, %s, replayed", run, try, resp.GetChargeId(), first)
			}
		}
		bal, err := client.GetBalance(ctx, &paymentsv1.GetBalanceRequest{CustomerId: "cust_1"})
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(1 - run); bal.GetCharges() != want {
			t.Errorf("run %d: this process's ledger ran %d charges, want %d", run, bal.GetCharges(), want)
		}
		conn.Close()
		if err := tool.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := tool.Wait(time.Minute); err != nil {
			t.Fatalf("run %d: payments-server after SIGTERM: %v\n%s", run, err, tool.Log())
		}
		if log := tool.Log(); !strings.Contains(log, "using the embedded store") || !strings.Contains(log, "dedupe=in-process") {
			t.Errorf("run %d: the log does not say the Dedupe service ran in-process on the embedded store:\n%s", run, log)
		}
	}
}
