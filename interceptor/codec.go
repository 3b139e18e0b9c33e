package interceptor

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// ServerCodec returns the server option that makes a gated gRPC server
// encode every message deterministically: the protobuf binary codec
// ("proto") with MarshalOptions{Deterministic: true}, which writes map
// fields in key order. Build the server with it:
//
//	srv := grpc.NewServer(gate.ServerCodec(), grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
//
// Without it grpc-go encodes responses with its default codec, which writes
// a map field in Go's random map order, so a first answer whose response
// holds a map and its replays carry the same message in different bytes
// (the stored outcome is deterministic; the encodings of it are not). Only
// maps are affected: a message without one encodes the same either way, and
// costs the same. Requests decode as with the default codec.
//
// It is grpc.ForceServerCodecV2, so it replaces every codec the server would
// pick by the request's content-subtype: leave it out of a server that also
// serves another encoding (application/grpc+json), and bring your own
// deterministic codec there. The Gate logs one warning when a gated method
// whose response can hold a map is called on a server that decodes with
// some other codec.
func (g *Gate) ServerCodec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(deterministicCodec{seen: &g.codec.seen})
}

// codecCheck is what the Gate knows of the server's codec: whether a
// request was ever decoded by ServerCodec's (seen), and the warning given
// once when a gated method with a map in its response is not.
type codecCheck struct {
	seen atomic.Bool
	warn sync.Once
}

// checkCodec warns, once per Gate, when a gated method whose response can
// hold a map runs on a server that did not decode its request with
// ServerCodec's codec: its first answers and replays may differ in bytes.
// The codec decodes the request before any interceptor runs, so by now it
// has said whether it is the server's.
func (g *Gate) checkCodec(fullMethod string, m *gatedMethod) {
	if !m.mapped || g.codec.seen.Load() {
		return
	}
	g.codec.warn.Do(func() {
		g.opts.logger.Warn("idemgate: a gated method's response has a map field and this gRPC server does not encode with the gate's deterministic codec, "+
			"so its first answer and its replays may carry the map in different orders; build the server with grpc.NewServer(gate.ServerCodec(), ...)",
			slog.String("method", fullMethod))
	})
}

// deterministicCodec is grpc-go's protobuf codec, deterministic.
type deterministicCodec struct {
	// seen is set on the first request it decodes (Gate.checkCodec).
	seen *atomic.Bool
}

var _ encoding.CodecV2 = deterministicCodec{}

// Name is the protobuf codec's, so the server answers application/grpc as
// with the default codec.
func (deterministicCodec) Name() string { return "proto" }

func (deterministicCodec) Marshal(v any) (mem.BufferSlice, error) {
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("idemgate: cannot encode %T, not a protobuf message", v)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (c deterministicCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.seen.Store(true)
	m := messageOf(v)
	if m == nil {
		return fmt.Errorf("idemgate: cannot decode into %T, not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// messageOf is v as a protobuf message (either API), or nil.
func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	case protoadapt.MessageV2:
		return v
	}
	return nil
}
