// Package stacktest starts the whole idemgate stack for a test: Dedupe
// service replicas on a fresh PostgreSQL schema and tool servers gated by the
// interceptor, all on loopback TCP, torn down when the test ends.
package stacktest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// Config shapes a stack. The zero value is the production shape: NOTIFY on,
// default options.
type Config struct {
	// GateOptions configure the interceptor.
	GateOptions []interceptor.Option
	// ToolDial are extra dial options for the connection to the tool server.
	ToolDial []grpc.DialOption
	// ToolInterceptors run on the tool server before the gate (a panic
	// recovery, for example).
	ToolInterceptors []grpc.UnaryServerInterceptor
	// DedupeClientInterceptor, when set, sits on the gate's connection to the
	// Dedupe service, to inject faults.
	DedupeClientInterceptor grpc.UnaryClientInterceptor
	// NoNotify turns LISTEN/NOTIFY off: waiting duplicates only poll.
	NoNotify bool
	// PollInterval is the Dedupe service's poll interval. Defaults to 200ms.
	PollInterval time.Duration
	// DedupeMetrics, when set, counts the Dedupe service's outcomes.
	DedupeMetrics *dedupesvc.Metrics
	// DedupeOptions are extra options of the Dedupe service.
	DedupeOptions []dedupesvc.Option
	// InProcessDedupe makes the gate call the Dedupe service in-process
	// (dedupesvc.NewInProcessClient) instead of over loopback TCP; the
	// Dedupe gRPC server still serves Stack.Dedupe's connection.
	// DedupeClientInterceptor does not apply to the in-process client.
	InProcessDedupe bool
	// DefaultCodec builds the tool server with grpc-go's default codec
	// instead of the gate's deterministic one (Gate.ServerCodec), as a
	// server built without it is.
	DefaultCodec bool
	// PoolMaxConns, when set, sizes the Dedupe service's connection pool;
	// 0 keeps pgtest's 16.
	PoolMaxConns int32
}

// Stack is a running Dedupe service and gated tool server.
type Stack struct {
	// Pool is the schema's connection pool (unset by StartEmbedded, as are
	// Schema and Store).
	Pool *pgxpool.Pool
	// Schema is the test's schema, also the NOTIFY channel.
	Schema string
	// Store is the PostgreSQL store behind the Dedupe service.
	Store *pgstore.Store
	// DedupeServer is the Dedupe gRPC server; Stop it to take the store away.
	DedupeServer *grpc.Server
	// Service is the Dedupe service behind DedupeServer.
	Service *dedupesvc.Server
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
// server.
func Start(tb testing.TB, register func(*grpc.Server), cfg Config) *Stack {
	tb.Helper()
	s := &Stack{}
	s.Pool, s.Schema = pgtest.Schema(tb)
	if cfg.PoolMaxConns > 0 {
		s.Pool = pgtest.OpenPoolSize(tb, s.Schema, cfg.PoolMaxConns)
	}
	s.Store, s.DedupeServer, s.Service, s.Dedupe = s.replica(tb, s.Pool, cfg)
	s.Gate, s.Tool = s.tool(tb, s.gateDedupe(s.Service, s.Dedupe, cfg), register, cfg)
	return s
}

// StartEmbedded is Start on the embedded store (sqlitestore in a temporary
// directory) instead of PostgreSQL: Pool, Schema and Store stay unset.
func StartEmbedded(tb testing.TB, register func(*grpc.Server), cfg Config) *Stack {
	tb.Helper()
	store, err := sqlitestore.Open(context.Background(), tb.TempDir())
	if err != nil {
		tb.Fatalf("open the embedded store: %v", err)
	}
	tb.Cleanup(func() { _ = store.Close() })
	s := &Stack{}
	serverOpts := append([]dedupesvc.Option{discardLogger(), dedupesvc.WithNotifier(store)}, cfg.DedupeOptions...)
	s.DedupeServer, s.Service, s.Dedupe = s.serve(tb, store, serverOpts, cfg)
	s.Gate, s.Tool = s.tool(tb, s.gateDedupe(s.Service, s.Dedupe, cfg), register, cfg)
	return s
}

// gateDedupe is the Dedupe client the gate uses: dedupe, or an in-process
// one of service.
func (s *Stack) gateDedupe(service *dedupesvc.Server, dedupe idemgatev1.DedupeServiceClient, cfg Config) idemgatev1.DedupeServiceClient {
	if cfg.InProcessDedupe {
		return dedupesvc.NewInProcessClient(service)
	}
	return dedupe
}

func discardLogger() dedupesvc.Option {
	return dedupesvc.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// SecondTool starts another Dedupe service replica on the same schema (its
// own pool and listener) and another gated tool server that uses it, and
// returns a connection to that tool server and the replica's service.
func (s *Stack) SecondTool(tb testing.TB, register func(*grpc.Server), cfg Config) (*grpc.ClientConn, *dedupesvc.Server) {
	tb.Helper()
	_, _, service, dedupe := s.replica(tb, pgtest.OpenPool(tb, s.Schema), cfg)
	_, conn := s.tool(tb, s.gateDedupe(service, dedupe, cfg), register, cfg)
	return conn, service
}

func (s *Stack) replica(tb testing.TB, pool *pgxpool.Pool, cfg Config) (*pgstore.Store, *grpc.Server, *dedupesvc.Server, idemgatev1.DedupeServiceClient) {
	tb.Helper()
	storeOpts := []pgstore.Option{pgstore.WithChannel(s.Schema)}
	serverOpts := []dedupesvc.Option{discardLogger()}
	if cfg.PollInterval > 0 {
		serverOpts = append(serverOpts, dedupesvc.WithPollInterval(cfg.PollInterval))
	}
	if cfg.DedupeMetrics != nil {
		serverOpts = append(serverOpts, dedupesvc.WithMetrics(cfg.DedupeMetrics))
	}
	serverOpts = append(serverOpts, cfg.DedupeOptions...)
	if cfg.NoNotify {
		storeOpts = append(storeOpts, pgstore.WithoutNotify())
	} else {
		listener := pgstore.NewListener(pool, s.Schema, slog.New(slog.NewTextHandler(io.Discard, nil)))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); listener.Run(ctx) }()
		tb.Cleanup(func() { cancel(); <-done })
		serverOpts = append(serverOpts, dedupesvc.WithNotifier(listener))
	}
	store := pgstore.New(pool, storeOpts...)
	srv, service, client := s.serve(tb, store, serverOpts, cfg)
	return store, srv, service, client
}

// serve runs a Dedupe service over store on loopback and returns its
// server, the service and a client of it.
func (s *Stack) serve(tb testing.TB, store dedupesvc.Store, serverOpts []dedupesvc.Option, cfg Config) (*grpc.Server, *dedupesvc.Server, idemgatev1.DedupeServiceClient) {
	tb.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		s.DedupeCalls.Add(1)
		return handler(ctx, req)
	}))
	service := dedupesvc.NewServer(store, serverOpts...)
	idemgatev1.RegisterDedupeServiceServer(srv, service)
	dial := []grpc.DialOption{grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig)}
	if cfg.DedupeClientInterceptor != nil {
		dial = append(dial, grpc.WithChainUnaryInterceptor(cfg.DedupeClientInterceptor))
	}
	return srv, service, idemgatev1.NewDedupeServiceClient(Serve(tb, srv, dial...))
}

func (s *Stack) tool(tb testing.TB, dedupe idemgatev1.DedupeServiceClient, register func(*grpc.Server), cfg Config) (*interceptor.Gate, *grpc.ClientConn) {
	tb.Helper()
	gate, err := interceptor.New(dedupe, cfg.GateOptions...)
	if err != nil {
		tb.Fatalf("interceptor.New: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	chain := append(append([]grpc.UnaryServerInterceptor{}, cfg.ToolInterceptors...), gate.UnaryServerInterceptor())
	serverOpts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(chain...), grpc.ChainStreamInterceptor(gate.StreamServerInterceptor())}
	if !cfg.DefaultCodec {
		serverOpts = append(serverOpts, gate.ServerCodec())
	}
	toolSrv := grpc.NewServer(serverOpts...)
	register(toolSrv)
	return gate, Serve(tb, toolSrv, cfg.ToolDial...)
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
