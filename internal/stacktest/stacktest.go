// Package stacktest starts the whole idemgate stack for a test: a Dedupe
// service on a fresh PostgreSQL schema and a tool server gated by the
// interceptor, both on loopback TCP, torn down when the test ends.
package stacktest

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/pgtest"
)

// Stack is a running Dedupe service and gated tool server.
type Stack struct {
	// Pool is the schema's connection pool.
	Pool *pgxpool.Pool
	// Store is the PostgreSQL store behind the Dedupe service.
	Store *pgstore.Store
	// DedupeServer is the Dedupe gRPC server; Stop it to take the store away.
	DedupeServer *grpc.Server
	// DedupeCalls counts the RPCs the Dedupe service received.
	DedupeCalls atomic.Int64
	// Dedupe is a client of the Dedupe service.
	Dedupe idemgatev1.DedupeServiceClient
	// Gate is the interceptor's gate on the tool server.
	Gate *interceptor.Gate
	// Tool is a client connection to the gated tool server.
	Tool *grpc.ClientConn
}

// Start runs the stack; register adds the tool's services to the gated
// server. toolDial are extra dial options for the connection to the tool.
func Start(tb testing.TB, register func(*grpc.Server), gateOpts []interceptor.Option, toolDial ...grpc.DialOption) *Stack {
	tb.Helper()
	s := &Stack{}
	s.Pool = pgtest.Pool(tb)
	s.Store = pgstore.New(s.Pool)

	s.DedupeServer = grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		s.DedupeCalls.Add(1)
		return handler(ctx, req)
	}))
	idemgatev1.RegisterDedupeServiceServer(s.DedupeServer, dedupesvc.NewServer(s.Store))
	s.Dedupe = idemgatev1.NewDedupeServiceClient(Serve(tb, s.DedupeServer, grpc.WithDefaultServiceConfig(interceptor.DedupeServiceConfig)))

	gate, err := interceptor.New(s.Dedupe, gateOpts...)
	if err != nil {
		tb.Fatalf("interceptor.New: %v", err)
	}
	s.Gate = gate
	toolSrv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	register(toolSrv)
	s.Tool = Serve(tb, toolSrv, toolDial...)
	return s
}

// Serve starts srv on a loopback port and returns a client connection to it.
func Serve(tb testing.TB, srv *grpc.Server, dialOpts ...grpc.DialOption) *grpc.ClientConn {
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
