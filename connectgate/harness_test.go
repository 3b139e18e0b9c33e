package connectgate_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	_ "google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/gen/idemgate/testing/v1/testingv1connect"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

// handler is TestService over Connect: it counts its executions and does
// what each request asks (wait, fail, set response headers and trailers).
// It honours its context, as a provider client does.
type handler struct {
	testingv1connect.UnimplementedTestServiceHandler
	executions atomic.Int64
	// provider, when set, is called with the handler's context after the
	// side effect; its error is the handler's.
	provider func(ctx context.Context) error

	mu      sync.Mutex
	started map[string]chan struct{}
}

// Started is closed once a handler started a request with payload.
func (h *handler) Started(payload string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.startedLocked(payload)
}

func (h *handler) startedLocked(payload string) chan struct{} {
	if h.started == nil {
		h.started = map[string]chan struct{}{}
	}
	ch, ok := h.started[payload]
	if !ok {
		ch = make(chan struct{})
		h.started[payload] = ch
	}
	return ch
}

func (h *handler) handle(ctx context.Context, req *connect.Request[testingv1.MutateRequest]) (*connect.Response[testingv1.MutateResponse], error) {
	n := h.executions.Add(1)
	h.mu.Lock()
	started := h.startedLocked(req.Msg.GetPayload())
	select {
	case <-started:
	default:
		close(started)
	}
	h.mu.Unlock()
	if d := req.Msg.GetDelay().AsDuration(); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
	if h.provider != nil {
		if err := h.provider(ctx); err != nil {
			return nil, err
		}
	}
	if c := req.Msg.GetFailCode(); c != 0 {
		ce := connect.NewError(connect.Code(c), errors.New("handler failing on request"))
		if d := req.Msg.GetFailDetail(); d != "" {
			if detail, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: d, Domain: "test.idemgate.dev"}); err == nil {
				ce.AddDetail(detail)
			}
		}
		for _, p := range req.Msg.GetSetHeader() {
			ce.Meta().Add(p.GetKey(), string(p.GetValue()))
		}
		if req.Msg.GetFailMark() == testingv1.ErrorMark_ERROR_MARK_FINAL {
			return nil, idemgate.FinalError(ce)
		}
		return nil, ce
	}
	key, _ := idemgate.KeyFromContext(ctx)
	downstream, _ := idemgate.DownstreamKeyFromContext(ctx)
	token, _ := idemgate.FencingTokenFromContext(ctx)
	resp := connect.NewResponse(&testingv1.MutateResponse{Payload: req.Msg.GetPayload(), Execution: n, Key: key, Epoch: token.Epoch, DownstreamKey: downstream})
	for _, p := range req.Msg.GetSetHeader() {
		resp.Header().Add(p.GetKey(), string(p.GetValue()))
	}
	for _, p := range req.Msg.GetSetTrailer() {
		resp.Trailer().Add(p.GetKey(), string(p.GetValue()))
	}
	return resp, nil
}

func (h *handler) Mutate(ctx context.Context, req *connect.Request[testingv1.MutateRequest]) (*connect.Response[testingv1.MutateResponse], error) {
	return h.handle(ctx, req)
}

func (h *handler) MutateNoWait(ctx context.Context, req *connect.Request[testingv1.MutateRequest]) (*connect.Response[testingv1.MutateResponse], error) {
	return h.handle(ctx, req)
}

func (h *handler) MutateReplayErrors(ctx context.Context, req *connect.Request[testingv1.MutateRequest]) (*connect.Response[testingv1.MutateResponse], error) {
	return h.handle(ctx, req)
}

func (h *handler) MutateAfterReply(ctx context.Context, req *connect.Request[testingv1.MutateRequest]) (*connect.Response[testingv1.MutateResponse], error) {
	return h.handle(ctx, req)
}

func (h *handler) MutateKeyless(ctx context.Context, req *connect.Request[testingv1.MutateRequest]) (*connect.Response[testingv1.MutateResponse], error) {
	return h.handle(ctx, req)
}

func (h *handler) Unmarked(ctx context.Context, req *connect.Request[testingv1.MutateRequest]) (*connect.Response[testingv1.MutateResponse], error) {
	return h.handle(ctx, req)
}

func (h *handler) Watch(ctx context.Context, req *connect.Request[testingv1.MutateRequest], stream *connect.ServerStream[testingv1.MutateResponse]) error {
	n := h.executions.Add(1)
	for range 2 {
		if err := stream.Send(&testingv1.MutateResponse{Payload: req.Msg.GetPayload(), Execution: n}); err != nil {
			return err
		}
	}
	return nil
}

// harness is a Dedupe service on its own PostgreSQL schema, a gRPC tool
// server gated by the interceptor on it (stack.Tool, testsvc), and an h2c
// HTTP server with TestService over Connect gated by connectgate on the
// same Dedupe service.
type harness struct {
	stack   *stacktest.Stack
	grpcSvc *testsvc.Server
	h       *handler
	gate    *connectgate.Gate
	url     string
	http    *http.Client
}

func setup(t *testing.T, h *handler, opts ...connectgate.Option) *harness {
	t.Helper()
	return setupWrapped(t, h, nil, opts...)
}

// setupWrapped is setup with the gate's Dedupe client wrapped by wrap
// (nil: not wrapped), for a test that reads or rewrites what is stored.
func setupWrapped(t *testing.T, h *handler, wrap func(idemgatev1.DedupeServiceClient) idemgatev1.DedupeServiceClient, opts ...connectgate.Option) *harness {
	t.Helper()
	grpcSvc := &testsvc.Server{}
	stack := stacktest.Start(t, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, grpcSvc) }, stacktest.Config{})
	if h == nil {
		h = &handler{}
	}
	var dedupe idemgatev1.DedupeServiceClient = stack.Dedupe
	if wrap != nil {
		dedupe = wrap(dedupe)
	}
	gate, err := connectgate.New(dedupe, opts...)
	if err != nil {
		t.Fatalf("connectgate.New: %v", err)
	}
	mux := http.NewServeMux()
	path, service := testingv1connect.NewTestServiceHandler(h, gate.HandlerOptions()...)
	mux.Handle(path, gate.HTTPMiddleware(service))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: protocols, ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		_ = srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	clientProtocols := new(http.Protocols)
	clientProtocols.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: clientProtocols}}
	t.Cleanup(client.CloseIdleConnections)
	return &harness{stack: stack, grpcSvc: grpcSvc, h: h, gate: gate, url: "http://" + lis.Addr().String(), http: client}
}

// protocols are the three a Connect handler serves, as the client picks them.
var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", nil},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

func (hs *harness) client(opts ...connect.ClientOption) testingv1connect.TestServiceClient {
	return testingv1connect.NewTestServiceClient(hs.http, hs.url, opts...)
}

// keyed is a request carrying key in the Idempotency-Key header.
func keyed(key string, msg *testingv1.MutateRequest) *connect.Request[testingv1.MutateRequest] {
	req := connect.NewRequest(msg)
	if key != "" {
		req.Header().Set(idemgate.KeyHeader, key)
	}
	return req
}

// testCtx bounds a test's calls generously: a starved scheduler must not
// fail them, only a hung one.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantError checks err is a connect error with code and the ErrorInfo
// reason, and returns its RetryInfo (nil without one).
func wantError(t *testing.T, err error, code connect.Code, reason string) *errdetails.RetryInfo {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T), want a connect error %v %s", err, err, code, reason)
	}
	if ce.Code() != code {
		t.Fatalf("code %v (%v), want %v", ce.Code(), err, code)
	}
	var infos []*errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			t.Fatalf("detail %s: %v", d.Type(), err)
		}
		switch v := v.(type) {
		case *errdetails.ErrorInfo:
			infos = append(infos, v)
		case *errdetails.RetryInfo:
			retry = v
		}
	}
	if len(infos) != 1 || infos[0].GetReason() != reason {
		t.Fatalf("ErrorInfo details %v, want exactly one with reason %s (%v)", infos, reason, err)
	}
	return retry
}

// grpcHeader receives a gRPC call's response header.
func grpcHeader(md *metadata.MD) grpc.CallOption { return grpc.Header(md) }

// filesWith builds a registry holding one service with the given methods.
func filesWith(t *testing.T, methods ...*descriptorpb.MethodDescriptorProto) *protoregistry.Files {
	t.Helper()
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("bad/v1/bad.proto"),
		Package:    proto.String("bad.v1"),
		Syntax:     proto.String("proto3"),
		Dependency: []string{"google/protobuf/empty.proto"},
		Service:    []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("BadService"), Method: methods}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	files := &protoregistry.Files{}
	if err := files.RegisterFile(fd); err != nil {
		t.Fatal(err)
	}
	return files
}
