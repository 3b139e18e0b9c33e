package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"

	"github.com/idemgate/idemgate/connectgate"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/gen/examples/payments/v1/paymentsv1connect"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// serveConnect serves svc over Connect, gRPC and gRPC-Web (HTTP/1.1 and
// h2c) on cfg.connectListen, gated by connectgate on dedupe (over conn, as
// the gRPC gate's, or nil in-process) with the policies the gRPC gate has
// (so one key names one charge over either listener), until ctx ends. stop
// shuts the server down and closes its gate.
func serveConnect(ctx context.Context, cfg config, svc *payments.Server, dedupe idemgatev1.DedupeServiceClient, conn *grpc.ClientConn, logger *slog.Logger) (stop func(), err error) {
	opts := []connectgate.Option{connectgate.WithLogger(logger)}
	if conn != nil {
		// Like the gRPC gate: an UNAVAILABLE answer reconnects at once,
		// so a live holder renews its lease after a Dedupe restart.
		opts = append(opts, connectgate.WithDedupeConn(conn))
	}
	if cfg.replayCacheEntries > 0 {
		opts = append(opts, connectgate.WithReplayCache(cfg.replayCacheEntries, cfg.replayCacheBytes))
	}
	if cfg.finishAfterReply {
		files, err := finishAfterReplyFiles(paymentsv1.PaymentsService_ChargeCard_FullMethodName)
		if err != nil {
			return nil, fmt.Errorf("-finish-after-reply: %w", err)
		}
		opts = append(opts, connectgate.WithFiles(files))
	}
	gate, err := connectgate.New(dedupe, opts...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	// The gate's limits (4 MiB a request message, compressed or inflated, as
	// the gRPC listener's; 4 MiB a response) hold before a request is decoded.
	path, handler := paymentsv1connect.NewPaymentsServiceHandler(payments.ConnectHandler{Server: svc}, gate.HandlerOptions(
		connect.WithRecover(func(context.Context, connect.Spec, http.Header, any) error {
			return connect.NewError(connect.CodeInternal, errors.New("the handler panicked")) // a lost outcome; the gate re-panics it
		}))...)
	mux.Handle(path, gate.HTTPMiddleware(handler))
	lis, err := net.Listen("tcp", cfg.connectListen)
	if err != nil {
		return nil, fmt.Errorf("-connect-listen %s: %w", cfg.connectListen, err)
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // plaintext for this loopback example; use TLS between machines
	// Timeouts and connection caps, in total and per client address, so
	// slow, idle or never-reading clients cannot take the descriptors this
	// process shares with the gRPC tool server (-read-timeout and the rest).
	srv := cfg.http.Server(mux)
	srv.Protocols = protocols
	go func() {
		if err := srv.Serve(cfg.http.Listener(lis)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("the Connect listener failed", slog.Any("error", err))
		}
	}()
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	logger.Info("payments tool server serving over Connect, gRPC and gRPC-Web", slog.String("address", lis.Addr().String()))
	return func() {
		_ = srv.Shutdown(context.Background())
		closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := gate.Close(closeCtx); err != nil {
			logger.Error("Connect outcomes still unstored at exit", slog.Any("error", err))
		}
	}, nil
}
