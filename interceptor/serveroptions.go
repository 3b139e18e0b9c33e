package interceptor

import "google.golang.org/grpc"

// ServerOptions returns what a gated gRPC server is built with, in one call:
// ServerCodec (so a replay's bytes are the first answer's), then extra, then
// the gate's unary and stream interceptors, so interceptors among extra
// (panic recovery, authentication, which the tenant function may read) run
// before the gate:
//
//	srv := grpc.NewServer(gate.ServerOptions(
//		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(), authInterceptor))...)
//
// A grpc.ForceServerCodec or ForceServerCodecV2 among extra replaces the
// gate's codec (the last one wins): make yours deterministic too. Building
// the server from ServerCodec and UnaryServerInterceptor apart does the same.
func (g *Gate) ServerOptions(extra ...grpc.ServerOption) []grpc.ServerOption {
	opts := make([]grpc.ServerOption, 0, len(extra)+3)
	opts = append(opts, g.ServerCodec())
	opts = append(opts, extra...)
	return append(opts,
		grpc.ChainUnaryInterceptor(g.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(g.StreamServerInterceptor()))
}
