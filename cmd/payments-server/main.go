// Command payments-server runs the example PaymentsService tool server,
// gated by the idemgate interceptor against a running dedupe service.
//
//	payments-server [-listen 127.0.0.1:50052] [-dedupe 127.0.0.1:50051] [-reflection]
//
// With -reflection it also serves gRPC server reflection, so grpcurl and
// other generic clients can list the service and decode the
// google.rpc.ErrorInfo and RetryInfo details of its errors.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/reflection"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

func main() {
	listen := flag.String("listen", envOr("PAYMENTS_LISTEN", "127.0.0.1:50052"), "gRPC listen `address` of the tool server (env PAYMENTS_LISTEN)")
	dedupeAddr := flag.String("dedupe", envOr("IDEMGATE_DEDUPE_ADDR", "127.0.0.1:50051"), "`address` of the dedupe service (env IDEMGATE_DEDUPE_ADDR)")
	token := flag.String("dedupe-token", os.Getenv("IDEMGATE_DEDUPE_TOKEN"), "bearer `token` for a dedupe service started with -token-file (env IDEMGATE_DEDUPE_TOKEN)")
	reflect := flag.Bool("reflection", envBool("PAYMENTS_REFLECTION"), "serve gRPC server reflection, for grpcurl and other generic clients (env PAYMENTS_REFLECTION)")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *dedupeAddr, *token, *reflect, logger); err != nil {
		logger.Error("payments-server failed", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(listen, dedupeAddr, token string, reflect bool, logger *slog.Logger) error {
	// Plaintext is for this loopback example only; use TLS between machines.
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(interceptor.DedupeServiceConfig),
	}
	if token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(auth.BearerToken(token, true)))
	}
	conn, err := grpc.NewClient(dedupeAddr, dial...)
	if err != nil {
		return fmt.Errorf("dedupe client: %w", err)
	}
	defer conn.Close()
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), interceptor.WithLogger(logger))
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recovery.UnaryServerInterceptor(), // a panicking handler is a lost outcome; the gate re-panics it
		gate.UnaryServerInterceptor(),
	))
	paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: &payments.Ledger{}})
	if err := gate.CheckServer(srv); err != nil {
		return err // a served method nobody classified
	}
	if reflect {
		// After CheckServer, which ignores gRPC's own grpc.* services.
		// Reflection answers for every file linked into the binary, the
		// google.rpc error details included.
		reflection.Register(srv)
	}

	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	defer func() {
		// Outcomes whose Finish is still being retried get a last chance.
		closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := gate.Close(closeCtx); err != nil {
			logger.Error("outcomes still unstored at exit", slog.Any("error", err))
		}
	}()
	logger.Info("payments tool server serving", slog.String("address", lis.Addr().String()), slog.String("dedupe", dedupeAddr),
		slog.String("ChargeCard", gate.Policy(paymentsv1.PaymentsService_ChargeCard_FullMethodName).String()),
		slog.String("SendReceipt", gate.Policy(paymentsv1.PaymentsService_SendReceipt_FullMethodName).String()),
		slog.String("GetBalance", gate.Policy(paymentsv1.PaymentsService_GetBalance_FullMethodName).String()))
	return srv.Serve(lis)
}

// envBool reads a boolean environment variable: true for "1", "t", "true"
// and the like, false when unset or unparsable.
func envBool(key string) bool {
	v, _ := strconv.ParseBool(os.Getenv(key))
	return v
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
