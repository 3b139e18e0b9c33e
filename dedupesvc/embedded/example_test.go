package embedded_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate/dedupesvc/embedded"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// A tool server with the Dedupe service inside it: one process, the
// embedded store in a directory of its own (DatabaseURL for PostgreSQL).
// The gate closes first, so its last outcomes are stored, then the service.
func ExampleStart() {
	dir, err := os.MkdirTemp("", "embedded-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)

	svc, err := embedded.Start(ctx, embedded.Config{DataDir: dir, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	gate, err := interceptor.New(svc.Client(), interceptor.WithLogger(quiet))
	if err != nil {
		log.Fatal(err)
	}
	defer gate.Close(ctx)

	srv := grpc.NewServer(grpc.UnaryInterceptor(gate.UnaryServerInterceptor()))
	defer srv.Stop()
	paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: &payments.Ledger{}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)

	caller, err := interceptor.NewCaller() // sends WithKey's key with gated calls
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(caller.UnaryClientInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := paymentsv1.NewPaymentsServiceClient(conn)
	keyed := interceptor.WithKey(ctx, "order-1")
	for range 2 {
		var replayed bool
		if _, err := client.ChargeCard(keyed, &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 500},
			interceptor.Replayed(&replayed)); err != nil {
			log.Fatal(err)
		}
		fmt.Println("replayed:", replayed)
	}
	balance, err := client.GetBalance(ctx, &paymentsv1.GetBalanceRequest{CustomerId: "cust_1"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", balance.GetCharges())
	// Output:
	// replayed: false
	// replayed: true
	// charges: 1
}
