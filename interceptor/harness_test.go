package interceptor_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/pgtest"
	"github.com/idemgate/idemgate/internal/testsvc"
)

// harness is a tool server gated by a real Dedupe service on a real
// PostgreSQL schema, both listening on loopback TCP.
type harness struct {
	pool        *pgxpool.Pool
	store       *pgstore.Store
	dedupeSrv   *grpc.Server
	dedupeCalls atomic.Int64
	dedupe      idemgatev1.DedupeServiceClient
	gate        *interceptor.Gate
	svc         *testsvc.Server
	client      testingv1.TestServiceClient
	codec       *recordingCodec
}

func setup(tb testing.TB, opts ...interceptor.Option) *harness {
	tb.Helper()
	h := &harness{svc: &testsvc.Server{}, codec: &recordingCodec{}}
	h.pool = pgtest.Pool(tb)
	h.store = pgstore.New(h.pool)

	h.dedupeSrv = grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		h.dedupeCalls.Add(1)
		return handler(ctx, req)
	}))
	idemgatev1.RegisterDedupeServiceServer(h.dedupeSrv, dedupesvc.NewServer(h.store))
	dedupeConn := serve(tb, h.dedupeSrv, grpc.WithDefaultServiceConfig(interceptor.DedupeServiceConfig))
	h.dedupe = idemgatev1.NewDedupeServiceClient(dedupeConn)

	gate, err := interceptor.New(h.dedupe, opts...)
	if err != nil {
		tb.Fatalf("interceptor.New: %v", err)
	}
	h.gate = gate
	toolSrv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	testingv1.RegisterTestServiceServer(toolSrv, h.svc)
	toolConn := serve(tb, toolSrv, grpc.WithDefaultCallOptions(grpc.ForceCodec(h.codec)))
	h.client = testingv1.NewTestServiceClient(toolConn)
	return h
}

// serve starts srv on a loopback port and returns a client connection to it.
func serve(tb testing.TB, srv *grpc.Server, dialOpts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	go func() { _ = srv.Serve(lis) }()
	tb.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dialOpts...)...)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// withKey returns a context that sends key as the idempotency key.
func withKey(key string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_ = cancel // the timeout bounds a hung test; it ends with the test process
	return metadata.AppendToOutgoingContext(ctx, interceptor.KeyHeader, key)
}

// call makes one call and returns the response, its raw wire bytes and
// whether the server said it was replayed.
type result struct {
	resp     *testingv1.MutateResponse
	raw      []byte
	replayed bool
	err      error
}

func (h *harness) mutate(ctx context.Context, req *testingv1.MutateRequest) result {
	var header metadata.MD
	resp, err := h.client.Mutate(ctx, req, grpc.Header(&header))
	r := result{resp: resp, err: err, replayed: len(header.Get(interceptor.ReplayedHeader)) == 1 && header.Get(interceptor.ReplayedHeader)[0] == "true"}
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
