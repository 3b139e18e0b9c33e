package payments_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

func setup(t *testing.T) (paymentsv1.PaymentsServiceClient, *payments.Ledger, *stacktest.Stack) {
	ledger := &payments.Ledger{}
	stack := stacktest.Start(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, &payments.Server{Ledger: ledger})
	}, stacktest.Config{})
	return paymentsv1.NewPaymentsServiceClient(stack.Tool), ledger, stack
}

func key(k string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), idemgate.KeyHeader, k)
}

// The essay's incident: the client timed out after the charge succeeded and
// the framework retried. With the interceptor the ledger shows one charge.
func TestRetriedChargeChargesOnce(t *testing.T) {
	t.Parallel()
	client, ledger, _ := setup(t)
	req := &paymentsv1.ChargeCardRequest{CustomerId: "cust_17", AmountCents: 4200}

	first, err := client.ChargeCard(key("order-8842-charge"), req)
	if err != nil {
		t.Fatal(err)
	}
	var header metadata.MD
	second, err := client.ChargeCard(key("order-8842-charge"), req, grpc.Header(&header))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, second) || header.Get(idemgate.ReplayedHeader)[0] != "true" {
		t.Fatalf("retry got %v (replayed %v), want the replay of %v", second, header.Get(idemgate.ReplayedHeader), first)
	}
	charges := ledger.Charges()
	if len(charges) != 1 || !strings.HasPrefix(charges[0].IdempotencyKey, "idg_") {
		t.Fatalf("ledger %+v, want one charge made under the downstream key", charges)
	}
	bal, err := client.GetBalance(context.Background(), &paymentsv1.GetBalanceRequest{CustomerId: "cust_17"})
	if err != nil || bal.GetCharges() != 1 || bal.GetChargedCents() != 4200 {
		t.Fatalf("balance %v, %v; want 1 charge of 4200 (and no key needed to read it)", bal, err)
	}
}

func TestConcurrentReceiptsSendOne(t *testing.T) {
	t.Parallel()
	client, ledger, _ := setup(t)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			_, err := client.SendReceipt(key("order-1-receipt"), &paymentsv1.SendReceiptRequest{CustomerId: "c", ChargeId: "ch_1"})
			if err != nil && status.Code(err) != codes.Aborted {
				t.Errorf("SendReceipt: %v", err)
			}
		})
	}
	wg.Wait()
	if got := ledger.Receipts(); got != 1 {
		t.Fatalf("%d receipts sent, want 1", got)
	}
}

func TestChargeWithoutKeyIsRefused(t *testing.T) {
	t.Parallel()
	client, ledger, stack := setup(t)
	_, err := client.ChargeCard(context.Background(), &paymentsv1.ChargeCardRequest{CustomerId: "c", AmountCents: 1})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("keyless charge: %v, want INVALID_ARGUMENT", err)
	}
	if len(ledger.Charges()) != 0 || stack.DedupeCalls.Load() != 0 {
		t.Fatal("a keyless charge ran or reached the Dedupe service")
	}
}

// A restarted server starts a new ledger: its charges must not reuse the ids
// of charges the Dedupe service still replays from before the restart.
func TestChargeIDsUniqueAcrossRestarts(t *testing.T) {
	t.Parallel()
	req := &paymentsv1.ChargeCardRequest{CustomerId: "cust_17", AmountCents: 4200}
	seen := map[string]bool{}
	for restart := range 3 {
		srv := &payments.Server{Ledger: &payments.Ledger{}}
		for range 2 {
			resp, err := srv.ChargeCard(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if seen[resp.GetChargeId()] {
				t.Fatalf("after %d restarts a new charge got id %s, which an earlier ledger already gave out", restart, resp.GetChargeId())
			}
			seen[resp.GetChargeId()] = true
		}
		receipt, err := srv.SendReceipt(context.Background(), &paymentsv1.SendReceiptRequest{CustomerId: "cust_17", ChargeId: "ch_1"})
		if err != nil {
			t.Fatal(err)
		}
		if seen[receipt.GetMessageId()] {
			t.Fatalf("after %d restarts a new receipt got id %s, which an earlier ledger already gave out", restart, receipt.GetMessageId())
		}
		seen[receipt.GetMessageId()] = true
	}
}

// A handler honours its context as a real one does: a call whose caller is
// gone before the provider is reached does not act.
func TestChargeOnEndedContextDoesNotAct(t *testing.T) {
	t.Parallel()
	ledger := &payments.Ledger{}
	srv := &payments.Server{Ledger: ledger}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := srv.ChargeCard(ctx, &paymentsv1.ChargeCardRequest{CustomerId: "c", AmountCents: 1}); status.Code(err) != codes.Canceled {
		t.Fatalf("ChargeCard on an ended context: %v, want CANCELLED", err)
	}
	if _, err := srv.SendReceipt(ctx, &paymentsv1.SendReceiptRequest{CustomerId: "c", ChargeId: "ch_1"}); status.Code(err) != codes.Canceled {
		t.Fatalf("SendReceipt on an ended context: %v, want CANCELLED", err)
	}
	if len(ledger.Charges()) != 0 || ledger.Receipts() != 0 {
		t.Fatal("a call on an ended context reached the provider")
	}
}
