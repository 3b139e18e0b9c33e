package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/gen/idemgate/testing/v1/testingv1connect"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// connectListen is the -connect-listen flag.
var connectListen string

// serveConnect serves s's ChaosService through the generated Connect
// handler, gated by connectgate (the policies read from chaos.proto, as the
// interceptor reads them), over HTTP/1.1 and h2c on addr. With broken, a
// layer inside the gate marks every handler error retryable, as breakGate
// does for gRPC. stop shuts the server down and closes the gate.
func serveConnect(addr string, dedupe idemgatev1.DedupeServiceClient, conn *grpc.ClientConn, defaultBackoff, broken bool, s *server, logger *slog.Logger) (stop func(), err error) {
	opts := []connectgate.Option{connectgate.WithLogger(logger)}
	if defaultBackoff {
		opts = append(opts, connectgate.WithDedupeConn(conn))
	}
	gate, err := connectgate.New(dedupe, opts...)
	if err != nil {
		return nil, err
	}
	// The gate's interceptor and limits, then (inner) the breaking layer.
	handlerOpts := gate.HandlerOptions(connect.WithRecover(func(context.Context, connect.Spec, http.Header, any) error {
		return connect.NewError(connect.CodeInternal, errors.New("the handler panicked"))
	}))
	if broken {
		handlerOpts = append(handlerOpts, connect.WithInterceptors(breakConnect{}))
	}
	mux := http.NewServeMux()
	path, handler := testingv1connect.NewChaosServiceHandler(connectServer{s}, handlerOpts...)
	mux.Handle(path, gate.HTTPMiddleware(handler))
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: protocols, ReadHeaderTimeout: time.Minute, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("Connect server failed", slog.Any("error", err))
		}
	}()
	logger.Info("chaos tool serving Connect", slog.String("address", lis.Addr().String()),
		slog.String("Charge", gate.Policy(testingv1connect.ChaosServiceChargeProcedure).String()),
		slog.String("ChargeReexecute", gate.Policy(testingv1connect.ChaosServiceChargeReexecuteProcedure).String()))
	return func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(closeCtx)
		_ = gate.Close(closeCtx)
	}, nil
}

// connectServer is the ChaosService as a Connect handler: the gRPC
// handler's logic, its key, fencing token and downstream key read from the
// context connectgate gives it (idemgate.KeyFromContext and the rest),
// its errors as *connect.Error.
type connectServer struct{ s *server }

func (c connectServer) Charge(ctx context.Context, req *connect.Request[testingv1.ChargeRequest]) (*connect.Response[testingv1.ChargeResponse], error) {
	return c.charge(ctx, req.Msg, testingv1.ChaosService_Charge_FullMethodName)
}

func (c connectServer) ChargeReexecute(ctx context.Context, req *connect.Request[testingv1.ChargeRequest]) (*connect.Response[testingv1.ChargeResponse], error) {
	return c.charge(ctx, req.Msg, testingv1.ChaosService_ChargeReexecute_FullMethodName)
}

func (c connectServer) charge(ctx context.Context, req *testingv1.ChargeRequest, method string) (*connect.Response[testingv1.ChargeResponse], error) {
	key, _ := idemgate.KeyFromContext(ctx)
	token, _ := idemgate.FencingTokenFromContext(ctx)
	downstream, _ := idemgate.DownstreamKeyFromContext(ctx)
	resp, _, err := c.s.execute(ctx, req, execution{key: key, method: method, epoch: token.Epoch, downstream: downstream})
	switch {
	case err == nil:
		return connect.NewResponse(resp), nil
	case errors.Is(err, errAmbiguous):
		return nil, connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, context.DeadlineExceeded):
		return nil, connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, context.Canceled):
		return nil, connect.NewError(connect.CodeCanceled, err)
	default:
		return nil, connect.NewError(connect.CodeInternal, err)
	}
}

// breakConnect is the broken layer for Connect: between the gate and the
// handler, it marks every handler error retryable.
type breakConnect struct{}

func (breakConnect) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			return resp, idemgate.RetryableError(err)
		}
		return resp, nil
	}
}

func (breakConnect) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (breakConnect) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
