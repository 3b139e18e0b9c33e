// Command paymentsctl calls the example payments tool server, so the
// deduplication can be seen by hand:
//
//	paymentsctl charge  -key order-8842 -customer cust_17 -amount 4200
//	paymentsctl receipt -key order-8842-receipt -customer cust_17 -charge ch_k7q2m4xa_000001
//	paymentsctl balance -customer cust_17
//
// Each command prints one line; a refused call prints the gRPC code and the
// idemgate reason and exits 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/version"
)

const usage = `usage: paymentsctl [-addr host:port] <command> [flags]
       paymentsctl -version

commands:
  charge  -key K -customer C -amount CENTS   charge a card (gated: needs -key)
  receipt -key K -customer C -charge ID      send a receipt (gated: needs -key)
  balance -customer C                        read a balance (not gated)
`

func main() {
	top := flag.NewFlagSet("paymentsctl", flag.ExitOnError)
	top.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	addr := top.String("addr", "127.0.0.1:50052", "address of the payments tool server")
	showVersion := version.Flag(top)
	_ = top.Parse(os.Args[1:])
	if *showVersion {
		version.Print(os.Stdout, "paymentsctl")
		return
	}
	if top.NArg() == 0 {
		top.Usage()
		os.Exit(2)
	}
	cmd := flag.NewFlagSet(top.Arg(0), flag.ExitOnError)
	key := cmd.String("key", "", "idempotency key naming the action (empty sends none)")
	customer := cmd.String("customer", "cust_17", "customer id")
	amount := cmd.Int64("amount", 4200, "amount in cents")
	charge := cmd.String("charge", "", "charge id the receipt is for")
	_ = cmd.Parse(top.Args()[1:])

	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	client := paymentsv1.NewPaymentsServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if *key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, *key)
	}
	var header metadata.MD
	replayed := func() bool {
		v := header.Get(idemgate.ReplayedHeader)
		return len(v) == 1 && v[0] == "true"
	}

	switch top.Arg(0) {
	case "charge":
		resp, err := client.ChargeCard(ctx, &paymentsv1.ChargeCardRequest{CustomerId: *customer, AmountCents: *amount}, grpc.Header(&header))
		if err != nil {
			fail(err)
		}
		fmt.Printf("charge_id=%s customer=%s amount_cents=%d replayed=%t\n", resp.GetChargeId(), resp.GetCustomerId(), resp.GetAmountCents(), replayed())
	case "receipt":
		resp, err := client.SendReceipt(ctx, &paymentsv1.SendReceiptRequest{CustomerId: *customer, ChargeId: *charge}, grpc.Header(&header))
		if err != nil {
			fail(err)
		}
		fmt.Printf("message_id=%s replayed=%t\n", resp.GetMessageId(), replayed())
	case "balance":
		resp, err := client.GetBalance(ctx, &paymentsv1.GetBalanceRequest{CustomerId: *customer})
		if err != nil {
			fail(err)
		}
		fmt.Printf("customer=%s charges=%d charged_cents=%d receipts=%d\n", resp.GetCustomerId(), resp.GetCharges(), resp.GetChargedCents(), resp.GetReceipts())
	default:
		fmt.Fprintf(os.Stderr, "paymentsctl: unknown command %q\n%s", top.Arg(0), usage)
		os.Exit(2)
	}
}

func fail(err error) {
	st := status.Convert(err)
	fmt.Fprintf(os.Stderr, "error: code=%s reason=%s message=%q\n", st.Code(), grpcerr.Reason(err), st.Message())
	os.Exit(1)
}
