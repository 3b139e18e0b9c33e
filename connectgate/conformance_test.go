package connectgate_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/gen/idemgate/testing/v1/testingv1connect"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/gatetest"
)

// TestConformance runs the gate conformance suite against connectgate:
// ConformanceService through its generated Connect handler on an h2c
// server on loopback TCP, called by the generated Connect client, once over
// the Connect protocol and once over gRPC.
func TestConformance(t *testing.T) {
	for _, p := range []struct {
		name string
		opts []connect.ClientOption
	}{
		{"connect", nil},
		{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	} {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			gatetest.Run(t, func(t *testing.T, cfg gatetest.Config) gatetest.Client {
				return newConformanceGate(t, cfg, p.opts...)
			})
		})
	}
}

func newConformanceGate(t *testing.T, cfg gatetest.Config, clientOpts ...connect.ClientOption) gatetest.Client {
	t.Helper()
	dconn, err := grpc.NewClient(cfg.DedupeAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatalf("dial the Dedupe service: %v", err)
	}
	t.Cleanup(func() { _ = dconn.Close() })
	opts := []connectgate.Option{connectgate.WithLogger(slog.New(slog.DiscardHandler)), connectgate.WithDedupeConn(dconn),
		connectgate.WithInFlightRetryAfter(200 * time.Millisecond), connectgate.WithStoreRetryAfter(200 * time.Millisecond)}
	if cfg.ReplayCache {
		opts = append(opts, connectgate.WithReplayCache(256, 1<<20))
	}
	gate, err := connectgate.New(idemgatev1.NewDedupeServiceClient(dconn), opts...)
	if err != nil {
		t.Fatalf("connectgate.New: %v", err)
	}
	mux := http.NewServeMux()
	path, service := testingv1connect.NewConformanceServiceHandler(conformanceHandler{handle: cfg.Handler}, gate.HandlerOptions()...)
	mux.Handle(path, gate.HTTPMiddleware(service))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	// h2c: one connection multiplexes the calls, as a gRPC channel does.
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	httpClient := &http.Client{Transport: &http.Transport{Protocols: protocols}}
	t.Cleanup(httpClient.CloseIdleConnections)
	codec := &recordingCodec{}
	return conformanceClient{
		client: testingv1connect.NewConformanceServiceClient(httpClient, srv.URL, append([]connect.ClientOption{connect.WithCodec(codec)}, clientOpts...)...),
		codec:  codec,
	}
}

// conformanceHandler serves the suite's handler behind every method, its
// failures as connect errors with the interceptor's marks.
type conformanceHandler struct {
	testingv1connect.UnimplementedConformanceServiceHandler
	handle gatetest.Handler
}

func (h conformanceHandler) serve(ctx context.Context, method string, req *connect.Request[testingv1.ConformanceRequest]) (*connect.Response[testingv1.ConformanceResponse], error) {
	resp, err := h.handle(ctx, method, req.Msg)
	if err == nil {
		return connect.NewResponse(resp), nil
	}
	var f *gatetest.Failure
	if !errors.As(err, &f) {
		return nil, err
	}
	ce := connect.NewError(connect.Code(f.Code), errors.New(f.Message))
	switch f.Kind {
	case gatetest.Retryable:
		return nil, idemgate.RetryableError(ce)
	case gatetest.Final:
		return nil, idemgate.FinalError(ce)
	case gatetest.OutcomeUnknown:
		return nil, idemgate.OutcomeUnknownError(ce)
	}
	return nil, ce
}

func (h conformanceHandler) Charge(ctx context.Context, r *connect.Request[testingv1.ConformanceRequest]) (*connect.Response[testingv1.ConformanceResponse], error) {
	return h.serve(ctx, gatetest.MethodCharge, r)
}

func (h conformanceHandler) ChargeWait(ctx context.Context, r *connect.Request[testingv1.ConformanceRequest]) (*connect.Response[testingv1.ConformanceResponse], error) {
	return h.serve(ctx, gatetest.MethodChargeWait, r)
}

func (h conformanceHandler) ChargeReexecute(ctx context.Context, r *connect.Request[testingv1.ConformanceRequest]) (*connect.Response[testingv1.ConformanceResponse], error) {
	return h.serve(ctx, gatetest.MethodChargeReexecute, r)
}

func (h conformanceHandler) ChargeAfterReply(ctx context.Context, r *connect.Request[testingv1.ConformanceRequest]) (*connect.Response[testingv1.ConformanceResponse], error) {
	return h.serve(ctx, gatetest.MethodChargeAfterReply, r)
}

func (h conformanceHandler) ChargeBounded(ctx context.Context, r *connect.Request[testingv1.ConformanceRequest]) (*connect.Response[testingv1.ConformanceResponse], error) {
	return h.serve(ctx, gatetest.MethodChargeBounded, r)
}

func (h conformanceHandler) ChargeReplayErrors(ctx context.Context, r *connect.Request[testingv1.ConformanceRequest]) (*connect.Response[testingv1.ConformanceResponse], error) {
	return h.serve(ctx, gatetest.MethodChargeReplayErrors, r)
}

// recordingCodec is connect-go's binary proto codec ("proto") that also
// keeps the bytes each message was unmarshalled from.
type recordingCodec struct {
	seen sync.Map // proto.Message -> []byte
}

func (c *recordingCodec) Name() string { return "proto" }

func (c *recordingCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (c *recordingCodec) Unmarshal(data []byte, v any) error {
	c.seen.Store(v, append([]byte(nil), data...))
	return proto.Unmarshal(data, v.(proto.Message))
}

func (c *recordingCodec) bytesOf(v proto.Message) []byte {
	b, _ := c.seen.LoadAndDelete(v)
	raw, _ := b.([]byte)
	return raw
}

// conformanceClient calls the tool server through the generated client.
type conformanceClient struct {
	client testingv1connect.ConformanceServiceClient
	codec  *recordingCodec
}

func (c conformanceClient) Call(ctx context.Context, method, key string, msg *testingv1.ConformanceRequest) gatetest.Answer {
	req := connect.NewRequest(msg)
	if key != "" {
		req.Header().Set(idemgate.KeyHeader, key)
	}
	var call func(context.Context, *connect.Request[testingv1.ConformanceRequest]) (*connect.Response[testingv1.ConformanceResponse], error)
	switch method {
	case gatetest.MethodCharge:
		call = c.client.Charge
	case gatetest.MethodChargeWait:
		call = c.client.ChargeWait
	case gatetest.MethodChargeReexecute:
		call = c.client.ChargeReexecute
	case gatetest.MethodChargeAfterReply:
		call = c.client.ChargeAfterReply
	case gatetest.MethodChargeBounded:
		call = c.client.ChargeBounded
	case gatetest.MethodChargeReplayErrors:
		call = c.client.ChargeReplayErrors
	default:
		return gatetest.Answer{Code: codes.Unimplemented, Err: connect.NewError(connect.CodeUnimplemented, errors.New("no method "+method))}
	}
	resp, err := call(ctx, req)
	if err != nil {
		return errorAnswer(err)
	}
	return gatetest.Answer{Code: codes.OK, Response: resp.Msg, Body: c.codec.bytesOf(resp.Msg),
		Replayed: resp.Header().Get(idemgate.ReplayedHeader) == "true"}
}

// errorAnswer reads a failed call: its code, the ErrorInfo reason and the
// RetryInfo delay among its details, the replay mark among its metadata,
// and as Body its google.rpc.Status, deterministically marshalled.
func errorAnswer(err error) gatetest.Answer {
	a := gatetest.Answer{Err: err, Code: codes.Unknown}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return a
	}
	a.Code = codes.Code(ce.Code())
	a.Replayed = ce.Meta().Get(idemgate.ReplayedHeader) == "true"
	st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		v, err := d.Value()
		if err != nil {
			continue
		}
		switch v := v.(type) {
		case *errdetails.ErrorInfo:
			a.Reason = v.GetReason()
		case *errdetails.RetryInfo:
			a.RetryAfter = v.GetRetryDelay().AsDuration()
		}
	}
	a.Body, _ = proto.MarshalOptions{Deterministic: true}.Marshal(st)
	return a
}
