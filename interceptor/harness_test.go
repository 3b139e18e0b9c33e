package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

// harness is a tool server gated by a real Dedupe service on a real
// PostgreSQL schema, both listening on loopback TCP.
type harness struct {
	*stacktest.Stack
	svc    *testsvc.Server
	client testingv1.TestServiceClient
	codec  *recordingCodec
}

func setup(tb testing.TB, opts ...interceptor.Option) *harness {
	tb.Helper()
	return setupWith(tb, stacktest.Config{GateOptions: opts})
}

func setupWith(tb testing.TB, cfg stacktest.Config) *harness {
	tb.Helper()
	h := &harness{svc: &testsvc.Server{}, codec: &recordingCodec{}}
	cfg.ToolDial = append(cfg.ToolDial, grpc.WithDefaultCallOptions(grpc.ForceCodec(h.codec)))
	h.Stack = stacktest.Start(tb, h.register, cfg)
	h.client = testingv1.NewTestServiceClient(h.Tool)
	return h
}

func (h *harness) register(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, h.svc) }

// withKey returns a context that sends key as the idempotency key.
func withKey(key string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_ = cancel // the timeout bounds a hung test; it ends with the test process
	return metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key)
}

// call makes one call and returns the response, its raw wire bytes and
// whether the server said it was replayed.
type result struct {
	resp     *testingv1.MutateResponse
	raw      []byte
	replayed bool
	err      error
	// header is the response header, where the call helper records it.
	header metadata.MD
}

func (h *harness) mutate(ctx context.Context, req *testingv1.MutateRequest) result {
	var header metadata.MD
	resp, err := h.client.Mutate(ctx, req, grpc.Header(&header))
	r := result{resp: resp, err: err, replayed: len(header.Get(idemgate.ReplayedHeader)) == 1 && header.Get(idemgate.ReplayedHeader)[0] == "true", header: header}
	if resp != nil {
		r.raw = h.codec.bytesOf(resp)
	}
	return r
}

// recordingCodec is the proto codec that also keeps the exact bytes each
// response arrived as, so tests compare wire bytes, not decoded messages.
type recordingCodec struct {
	seen sync.Map // proto.Message -> []byte
}

func (c *recordingCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (c *recordingCodec) Unmarshal(data []byte, v any) error {
	c.seen.Store(v, append([]byte(nil), data...))
	return proto.Unmarshal(data, v.(proto.Message))
}

func (c *recordingCodec) Name() string { return "proto" }

func (c *recordingCodec) bytesOf(v proto.Message) []byte {
	b, _ := c.seen.Load(v)
	raw, _ := b.([]byte)
	return raw
}

// wantStatus fails the test unless err has code and reason.
func wantStatus(tb testing.TB, err error, code codes.Code, reason string) {
	tb.Helper()
	if got := status.Code(err); got != code {
		tb.Fatalf("code = %v, want %v (err: %v)", got, code, err)
	}
	if got := grpcerr.Reason(err); got != reason {
		tb.Fatalf("reason = %q, want %q (err: %v)", got, reason, err)
	}
}

// grpcHeader receives response headers through grpc.Header.
type grpcHeader struct{ metadata.MD }
