package interceptor_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// lossyNetwork sits on the tool server outside the gate: it records the key
// every attempt carried, and for the first failures attempts it lets the
// gated call run, then loses the response, as a client timeout would.
type lossyNetwork struct {
	mu       sync.Mutex
	keys     []string
	failures int
}

func (l *lossyNetwork) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	l.mu.Lock()
	l.keys = append(l.keys, strings.Join(md.Get(idemgate.KeyHeader), ","))
	lose := len(l.keys) <= l.failures
	l.mu.Unlock()
	if !lose {
		return handler(ctx, req)
	}
	// A lost response loses its headers too: without this, grpc-go would
	// see the replay's header arrive and stop retrying.
	ctx = grpc.NewContextWithServerTransportStream(ctx, headerless{grpc.ServerTransportStreamFromContext(ctx)})
	if _, err := handler(ctx, req); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.Unavailable, "test: the response was lost after the handler ran")
}

// headerless drops the headers of a response that will be lost.
type headerless struct{ grpc.ServerTransportStream }

func (headerless) SetHeader(metadata.MD) error  { return nil }
func (headerless) SendHeader(metadata.MD) error { return nil }

func (l *lossyNetwork) seen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// grpcRetryConfig makes grpc-go retry TestService calls on UNAVAILABLE, up
// to 5 attempts.
const grpcRetryConfig = `{"methodConfig": [{
  "name": [{"service": "idemgate.testing.v1.TestService"}],
  "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`

func middlewareRetry() grpc.UnaryClientInterceptor {
	return retry.UnaryClientInterceptor(retry.WithMax(5), retry.WithCodes(codes.Unavailable),
		retry.WithBackoff(retry.BackoffLinear(10*time.Millisecond)))
}

func TestRetriesReuseTheKey(t *testing.T) {
	t.Parallel()
	caller, err := interceptor.NewCaller(interceptor.WithMintedKeys())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		dial []grpc.DialOption
		ctx  context.Context
	}{
		{"grpc-go service-config retries, minted key",
			[]grpc.DialOption{grpc.WithDefaultServiceConfig(grpcRetryConfig), grpc.WithChainUnaryInterceptor(caller.UnaryClientInterceptor())},
			context.Background()},
		{"grpc-go service-config retries, WithKey",
			[]grpc.DialOption{grpc.WithDefaultServiceConfig(grpcRetryConfig), grpc.WithChainUnaryInterceptor(caller.UnaryClientInterceptor())},
			interceptor.WithKey(context.Background(), "order-8842")},
		{"go-grpc-middleware retry after the caller, minted key",
			[]grpc.DialOption{grpc.WithChainUnaryInterceptor(caller.UnaryClientInterceptor(), middlewareRetry())},
			context.Background()},
		{"go-grpc-middleware retry after the caller, WithKey",
			[]grpc.DialOption{grpc.WithChainUnaryInterceptor(caller.UnaryClientInterceptor(), middlewareRetry())},
			interceptor.WithKey(context.Background(), "order-8843")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lossy := &lossyNetwork{failures: 4}
			h := setupWith(t, stacktest.Config{ToolInterceptors: []grpc.UnaryServerInterceptor{lossy.intercept}, ToolDial: tt.dial})
			var replayed bool
			resp, err := h.client.Mutate(tt.ctx, &testingv1.MutateRequest{Payload: "charge"}, interceptor.Replayed(&replayed))
			if err != nil {
				t.Fatalf("after 4 retries: %v", err)
			}
			keys := lossy.seen()
			if len(keys) != 5 {
				t.Fatalf("the server saw %d attempts, want 5", len(keys))
			}
			for i, k := range keys {
				if k == "" || k != keys[0] {
					t.Fatalf("attempt %d carried key %q, want every attempt to carry %q: %v", i, k, keys[0], keys)
				}
			}
			if got := h.svc.Executions(); got != 1 {
				t.Fatalf("handler ran %d times over 5 attempts, want 1", got)
			}
			if !replayed || resp.GetExecution() != 1 {
				t.Fatalf("final attempt: replayed=%v execution=%d, want the replay of execution 1", replayed, resp.GetExecution())
			}
		})
	}

	// The documented order, proven: with the retry interceptor outside the
	// minting one, every attempt mints a fresh key and the side effect runs
	// on every attempt.
	t.Run("minting inside the retry interceptor runs the side effect per attempt", func(t *testing.T) {
		t.Parallel()
		lossy := &lossyNetwork{failures: 4}
		h := setupWith(t, stacktest.Config{
			ToolInterceptors: []grpc.UnaryServerInterceptor{lossy.intercept},
			ToolDial:         []grpc.DialOption{grpc.WithChainUnaryInterceptor(middlewareRetry(), caller.UnaryClientInterceptor())},
		})
		if _, err := h.client.Mutate(context.Background(), &testingv1.MutateRequest{Payload: "charge"}); err != nil {
			t.Fatal(err)
		}
		keys := lossy.seen()
		distinct := map[string]bool{}
		for _, k := range keys {
			distinct[k] = true
		}
		if len(distinct) != 5 || h.svc.Executions() != 5 {
			t.Fatalf("%d distinct keys, %d executions; want 5 and 5: the wrong order must show the duplicate", len(distinct), h.svc.Executions())
		}
	})

	t.Run("ungated calls get no key", func(t *testing.T) {
		t.Parallel()
		lossy := &lossyNetwork{}
		h := setupWith(t, stacktest.Config{
			ToolInterceptors: []grpc.UnaryServerInterceptor{lossy.intercept},
			ToolDial:         []grpc.DialOption{grpc.WithChainUnaryInterceptor(caller.UnaryClientInterceptor())},
		})
		if _, err := h.client.Read(context.Background(), &testingv1.MutateRequest{}); err != nil {
			t.Fatal(err)
		}
		if keys := lossy.seen(); len(keys) != 1 || keys[0] != "" {
			t.Fatalf("keys %q, want a read to carry none", keys)
		}
	})

	t.Run("without minting, a keyless gated call is refused", func(t *testing.T) {
		t.Parallel()
		plain, err := interceptor.NewCaller()
		if err != nil {
			t.Fatal(err)
		}
		h := setupWith(t, stacktest.Config{ToolDial: []grpc.DialOption{grpc.WithChainUnaryInterceptor(plain.UnaryClientInterceptor())}})
		_, err = h.client.Mutate(context.Background(), &testingv1.MutateRequest{})
		wantStatus(t, err, codes.InvalidArgument, idemgate.ReasonKeyMissing)
	})
}

func TestKeyInTheRequest(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{Payload: "charge", RequestId: "field-key"}
	first := h.mutate(context.Background(), req)
	if first.err != nil || first.resp.GetKey() != "field-key" {
		t.Fatalf("field key alone: %v %v, want the handler to see field-key", first.resp, first.err)
	}
	// The same key in the metadata agrees; the key field is not part of the
	// request's fingerprint, so a retry that moved the key still replays.
	agreeing := h.mutate(withKey("field-key"), req)
	moved := h.mutate(withKey("field-key"), &testingv1.MutateRequest{Payload: "charge"})
	for name, r := range map[string]result{"agreeing": agreeing, "moved to metadata": moved} {
		if r.err != nil || !r.replayed {
			t.Errorf("%s: %v replayed=%v, want a replay", name, r.err, r.replayed)
		}
	}
	r := h.mutate(withKey("other-key"), req)
	wantStatus(t, r.err, codes.InvalidArgument, idemgate.ReasonKeyConflict)
	if h.svc.Executions() != 1 {
		t.Fatalf("handler ran %d times, want 1", h.svc.Executions())
	}
}

func TestKeylessFingerprintWindow(t *testing.T) {
	t.Parallel()
	h := setup(t)
	call := func(req *testingv1.MutateRequest) (*testingv1.MutateResponse, metadata.MD, error) {
		var header metadata.MD
		resp, err := h.client.MutateKeyless(context.Background(), req, grpc.Header(&header))
		return resp, header, err
	}
	req := &testingv1.MutateRequest{Payload: "send receipt"}
	first, header, err := call(req)
	if err != nil || header.Get(idemgate.KeyDerivedHeader)[0] != "true" {
		t.Fatalf("keyless call: %v, header %v; want it run under a derived key", err, header)
	}
	second, header, err := call(req)
	if err != nil || !interceptor.IsReplayed(header) || second.GetExecution() != first.GetExecution() {
		t.Fatalf("identical keyless call in the window: %v %v, want the replay", second, err)
	}
	if _, _, err := call(&testingv1.MutateRequest{Payload: "another receipt"}); err != nil {
		t.Fatal(err)
	}
	if got := h.svc.Executions(); got != 2 {
		t.Fatalf("%d executions, want 2: one per distinct request", got)
	}
	time.Sleep(2100 * time.Millisecond) // the 2s window
	third, _, err := call(req)
	if err != nil || third.GetExecution() == first.GetExecution() {
		t.Fatalf("after the window: %v %v, want a fresh run", third, err)
	}
	// A method that rejects keyless calls still does.
	_, err = h.client.Mutate(context.Background(), req)
	wantStatus(t, err, codes.InvalidArgument, idemgate.ReasonKeyMissing)
}

func TestFingerprintIgnoresExcludedFieldsAndMapOrder(t *testing.T) {
	t.Parallel()
	h := setup(t)
	labels := func(order []int) map[string]string {
		m := map[string]string{}
		for _, i := range order {
			m[fmt.Sprint("label-", i)] = fmt.Sprint("value-", i)
		}
		return m
	}
	base := &testingv1.MutateRequest{Payload: "charge", ClientTimestamp: "2026-11-29T10:00:00Z",
		Meta: &testingv1.Meta{TraceId: "trace-1", Note: "n"}, Labels: labels([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})}
	if r := h.mutate(withKey("fp"), base); r.err != nil {
		t.Fatal(r.err)
	}
	sameAction := []*testingv1.MutateRequest{
		{Payload: "charge", ClientTimestamp: "2026-11-29T10:00:05Z", Meta: &testingv1.Meta{TraceId: "trace-1", Note: "n"}, Labels: base.Labels},
		{Payload: "charge", ClientTimestamp: "2026-11-29T10:00:00Z", Meta: &testingv1.Meta{TraceId: "trace-2", Note: "n"}, Labels: base.Labels},
		{Payload: "charge", ClientTimestamp: "2026-11-29T10:00:00Z", Meta: &testingv1.Meta{TraceId: "trace-1", Note: "n"}, Labels: labels([]int{9, 8, 7, 6, 5, 4, 3, 2, 1, 0})},
	}
	for i, req := range sameAction {
		if r := h.mutate(withKey("fp"), req); r.err != nil || !r.replayed {
			t.Errorf("retry %d changing only excluded fields or map order: %v replayed=%v, want a replay", i, r.err, r.replayed)
		}
	}
	changed := &testingv1.MutateRequest{Payload: "charge", ClientTimestamp: "x", Meta: &testingv1.Meta{TraceId: "trace-1", Note: "changed"}, Labels: base.Labels}
	wantStatus(t, h.mutate(withKey("fp"), changed).err, codes.FailedPrecondition, idemgate.ReasonKeyReused)
	if h.svc.Executions() != 1 {
		t.Fatalf("handler ran %d times, want 1", h.svc.Executions())
	}
}

func TestStrictModeAndStreams(t *testing.T) {
	t.Parallel()
	unclassified := method("Decide", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, nil)
	decided := method("Get", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, &idemgatev1.MethodPolicy{Mutating: false})
	files := filesWith(t, unclassified, decided)
	_, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files), interceptor.WithStrict())
	if err == nil || !strings.Contains(err.Error(), "/bad.v1.BadService/Decide") || strings.Contains(err.Error(), "BadService/Get") {
		t.Fatalf("strict New: %v, want it to refuse Decide, and only Decide", err)
	}
	if _, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files)); err != nil {
		t.Fatalf("New without strict mode: %v, want it built", err)
	}
	if _, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files), interceptor.WithStrict("bad.v1.BadService")); err == nil {
		t.Fatal("strict mode naming the service: built, want refused")
	}
	if _, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files), interceptor.WithStrict("other.v1.Service")); err != nil {
		t.Fatalf("strict mode naming another service: %v, want built", err)
	}

	h := setup(t)
	stream, err := h.client.Watch(context.Background(), &testingv1.MutateRequest{Payload: "tick"})
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for {
		_, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("an ungated stream through the stream interceptor: %v", err)
		}
		got++
	}
	if got != 2 || h.DedupeCalls.Load() != 0 {
		t.Fatalf("%d messages, %d Dedupe calls; want 2 and none", got, h.DedupeCalls.Load())
	}
}

func TestCheckServer(t *testing.T) {
	t.Parallel()
	unclassified := method("Decide", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, nil)
	decided := method("Get", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, &idemgatev1.MethodPolicy{Mutating: false})
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(filesWith(t, unclassified, decided)))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		served []string
		want   []string // each must be in the error; none: no error
		absent []string
	}{
		{"an unclassified method", []string{"bad.v1.BadService", "grpc.health.v1.Health"}, []string{"/bad.v1.BadService/Decide is neither"}, []string{"Get", "Health"}},
		{"a service the descriptors lack", []string{"other.v1.Service"}, []string{"service other.v1.Service is registered but not in the Gate's descriptors"}, nil},
		{"nothing served but gRPC's own", []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			served := servedServices{}
			for _, s := range tt.served {
				served[s] = grpc.ServiceInfo{}
			}
			err := gate.CheckServer(served)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("CheckServer = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckServer = nil, want an error naming %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("CheckServer = %v, want it to name %q", err, w)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(err.Error(), a) {
					t.Errorf("CheckServer = %v, want nothing about %q", err, a)
				}
			}
		})
	}

	// A real server: the test service leaves Unmarked and Watch undecided.
	h := setup(t)
	srv := grpc.NewServer()
	testingv1.RegisterTestServiceServer(srv, testingv1.UnimplementedTestServiceServer{})
	err = h.Gate.CheckServer(srv)
	if err == nil || !strings.Contains(err.Error(), "/idemgate.testing.v1.TestService/Unmarked") || !strings.Contains(err.Error(), "/idemgate.testing.v1.TestService/Watch") ||
		strings.Contains(err.Error(), "TestService/Mutate ") {
		t.Fatalf("CheckServer(the test server) = %v, want Unmarked and Watch named", err)
	}
}

// servedServices is a ServiceInfoProvider serving the named services.
type servedServices map[string]grpc.ServiceInfo

func (s servedServices) GetServiceInfo() map[string]grpc.ServiceInfo { return s }
