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
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/connectgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/gen/idemgate/testing/v1/testingv1connect"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// connectListen and connectDefaultCodec are the -connect-listen and
// -connect-default-codec flags.
var (
	connectListen       string
	connectDefaultCodec bool
)

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
	interceptors := []connect.Interceptor{gate.Interceptor()}
	if broken {
		interceptors = append(interceptors, breakConnect{})
	}
	handlerOpts := []connect.HandlerOption{connect.WithInterceptors(interceptors...)}
	if !connectDefaultCodec {
		handlerOpts = append(handlerOpts, connect.WithCodec(deterministicProtoCodec{}))
	}
	mux := http.NewServeMux()
	mux.Handle(testingv1connect.NewChaosServiceHandler(connectServer{s}, append(handlerOpts,
		connect.WithRecover(func(context.Context, connect.Spec, http.Header, any) error {
			return connect.NewError(connect.CodeInternal, errors.New("the handler panicked"))
		}))...))
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
// context connectgate gives it (interceptor.KeyFromContext and the rest),
// its errors as *connect.Error.
type connectServer struct{ s *server }

func (c connectServer) Charge(ctx context.Context, req *connect.Request[testingv1.ChargeRequest]) (*connect.Response[testingv1.ChargeResponse], error) {
	return c.charge(ctx, req.Msg, testingv1.ChaosService_Charge_FullMethodName)
}

func (c connectServer) ChargeReexecute(ctx context.Context, req *connect.Request[testingv1.ChargeRequest]) (*connect.Response[testingv1.ChargeResponse], error) {
	return c.charge(ctx, req.Msg, testingv1.ChaosService_ChargeReexecute_FullMethodName)
}

func (c connectServer) charge(ctx context.Context, req *testingv1.ChargeRequest, method string) (*connect.Response[testingv1.ChargeResponse], error) {
	key, _ := interceptor.KeyFromContext(ctx)
	token, _ := interceptor.FencingTokenFromContext(ctx)
	downstream, _ := interceptor.DownstreamKeyFromContext(ctx)
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
			return resp, interceptor.RetryableError(err)
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

// deterministicProtoCodec is connect-go's binary protobuf codec with
// deterministic marshalling. connectgate replays a stored outcome as a
// dynamicpb message, which the default codec's proto.Marshal encodes in an
// unstable field order, so a replay's bytes may differ from the first
// answer's (the same message, reordered). Deterministic marshalling encodes
// by field number, as the generated code does, so replays are the stored
// bytes again; -connect-default-codec serves with connect-go's default
// codec instead, which the checker then flags.
type deterministicProtoCodec struct{}

func (deterministicProtoCodec) Name() string { return "proto" }

func (deterministicProtoCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("chaos-tool codec: %T is not a proto.Message", v)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

func (deterministicProtoCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("chaos-tool codec: %T is not a proto.Message", v)
	}
	return proto.Unmarshal(data, m)
}
