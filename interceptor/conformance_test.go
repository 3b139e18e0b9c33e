package interceptor_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/gatetest"
)

// TestConformance runs the gate conformance suite against the interceptor:
// a real gRPC tool server and client on loopback TCP.
func TestConformance(t *testing.T) {
	gatetest.Run(t, newConformanceGate)
}

func newConformanceGate(t *testing.T, cfg gatetest.Config) gatetest.Client {
	t.Helper()
	dconn, err := grpc.NewClient(cfg.DedupeAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatalf("dial the Dedupe service: %v", err)
	}
	t.Cleanup(func() { _ = dconn.Close() })
	opts := []interceptor.Option{interceptor.WithLogger(discard), interceptor.WithDedupeConn(dconn),
		interceptor.WithInFlightRetryAfter(200 * time.Millisecond), interceptor.WithStoreRetryAfter(200 * time.Millisecond)}
	if cfg.ReplayCache {
		opts = append(opts, interceptor.WithReplayCache(256, 1<<20))
	}
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(dconn), opts...)
	if err != nil {
		t.Fatalf("interceptor.New: %v", err)
	}
	srv := grpc.NewServer(gate.ServerOptions()...)
	testingv1.RegisterConformanceServiceServer(srv, conformanceServer{handle: cfg.Handler})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	codec := &recordingCodec{}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(codec)))
	if err != nil {
		t.Fatalf("dial the tool server: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conformanceClient{conn: conn, codec: codec}
}

// conformanceServer serves the suite's handler behind every method, its
// failures as status errors with the interceptor's marks.
type conformanceServer struct {
	testingv1.UnimplementedConformanceServiceServer
	handle gatetest.Handler
}

func (s conformanceServer) serve(ctx context.Context, method string, req *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error) {
	resp, err := s.handle(ctx, method, req)
	var f *gatetest.Failure
	if !errors.As(err, &f) {
		return resp, err
	}
	err = status.Error(f.Code, f.Message)
	switch f.Kind {
	case gatetest.Retryable:
		return nil, idemgate.RetryableError(err)
	case gatetest.Final:
		return nil, idemgate.FinalError(err)
	case gatetest.OutcomeUnknown:
		return nil, idemgate.OutcomeUnknownError(err)
	}
	return nil, err
}

func (s conformanceServer) Charge(ctx context.Context, r *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error) {
	return s.serve(ctx, gatetest.MethodCharge, r)
}

func (s conformanceServer) ChargeWait(ctx context.Context, r *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error) {
	return s.serve(ctx, gatetest.MethodChargeWait, r)
}

func (s conformanceServer) ChargeReexecute(ctx context.Context, r *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error) {
	return s.serve(ctx, gatetest.MethodChargeReexecute, r)
}

func (s conformanceServer) ChargeAfterReply(ctx context.Context, r *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error) {
	return s.serve(ctx, gatetest.MethodChargeAfterReply, r)
}

func (s conformanceServer) ChargeBounded(ctx context.Context, r *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error) {
	return s.serve(ctx, gatetest.MethodChargeBounded, r)
}

func (s conformanceServer) ChargeReplayErrors(ctx context.Context, r *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error) {
	return s.serve(ctx, gatetest.MethodChargeReplayErrors, r)
}

// conformanceClient calls the tool server; codec keeps each response's wire
// bytes.
type conformanceClient struct {
	conn  *grpc.ClientConn
	codec *recordingCodec
}

func (c conformanceClient) Call(ctx context.Context, method, key string, req *testingv1.ConformanceRequest) gatetest.Answer {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key)
	}
	var header metadata.MD
	resp := &testingv1.ConformanceResponse{}
	err := c.conn.Invoke(ctx, "/"+testingv1.ConformanceService_ServiceDesc.ServiceName+"/"+method, req, resp, grpc.Header(&header))
	a := gatetest.Answer{Replayed: len(header.Get(idemgate.ReplayedHeader)) == 1 && header.Get(idemgate.ReplayedHeader)[0] == "true"}
	if err != nil {
		a.Err, a.Code, a.Reason = err, status.Code(err), grpcerr.Reason(err)
		a.RetryAfter, _ = grpcerr.RetryDelay(err)
		a.Body, _ = proto.MarshalOptions{Deterministic: true}.Marshal(status.Convert(err).Proto())
		return a
	}
	a.Code, a.Response, a.Body = codes.OK, resp, c.codec.bytesOf(resp)
	return a
}
