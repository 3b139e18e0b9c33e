package dedupeapp

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
)

// rawBytes sends the bytes it is given as they are.
type rawBytes struct{}

func (rawBytes) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawBytes) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawBytes) Name() string                         { return "proto" }

// pending is how many malformed messages the codec still remembers.
func (c *requestCodec) pending() int {
	n := 0
	c.malformed.Range(func(any, any) bool { n++; return true })
	return n
}

// A malformed Health.Watch request whose stream the client resets before
// half-closing it is forgotten: grpc-go waits for the end of a
// server-streaming request after its one message, so RecvMsg fails after
// the codec noted the message, and the note used to stay, with the
// message, for the life of the process (about 238 bytes a stream).
func TestMalformedStreamRequestsAreForgotten(t *testing.T) {
	t.Parallel()
	codec := newRequestCodec()
	srv := grpc.NewServer(grpc.ForceServerCodecV2(codec),
		grpc.ChainUnaryInterceptor(codec.unaryInterceptor()), grpc.ChainStreamInterceptor(codec.streamInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	const streams = 50
	// ClientStreams on this side only: the client sends its message without
	// half-closing, as a raw HTTP/2 client may.
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range streams {
		s, err := conn.NewStream(ctx, desc, "/grpc.health.v1.Health/Watch", grpc.ForceCodecV2(rawBytes{}))
		if err != nil {
			t.Fatal(err)
		}
		bad := []byte{0x0a, 0x02, 0xff, 0xfe} // a service name that is not UTF-8
		if err := s.SendMsg(&bad); err != nil {
			t.Fatal(err)
		}
	}
	// Every stream's request is parsed and noted while its stream is open.
	waitFor(t, "the server to parse every malformed request", func() bool { return codec.pending() == streams })
	cancel() // RST_STREAM on every stream, none half-closed
	var left int
	for range 600 {
		if left = codec.pending(); left == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%d of %d malformed requests of reset streams are still held by the codec, want 0", left, streams)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1200 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}
