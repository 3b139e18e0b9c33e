package connectgate_test

import (
	"bytes"
	"context"
	stdjson "encoding/json"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	"github.com/idemgate/idemgate/internal/testing/mapsvc"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// A first answer whose response is a map of 64 entries and every replay of
// it are byte-identical on the wire, over the Connect, gRPC and gRPC-Web
// protocols, in binary protobuf and in JSON: the handler built with the
// gate's HandlerOptions encodes deterministically, as the stored outcome
// is, so neither the first answer nor a replay is written in Go's random
// map order.
func TestFirstAnswerAndReplaysOfAMapAreByteIdentical(t *testing.T) {
	t.Parallel()
	files, err := mapsvc.Files()
	if err != nil {
		t.Fatal(err)
	}
	stack := stacktest.Start(t, func(*grpc.Server) {}, stacktest.Config{})
	gate, err := connectgate.New(stack.Dedupe, connectgate.WithFiles(files), connectgate.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle(mapsvc.Procedure, gate.HTTPMiddleware(connect.NewUnaryHandler(mapsvc.Procedure,
		func(context.Context, *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
			return connect.NewResponse(mapsvc.Answer(runs.Add(1))), nil
		}, gate.HandlerOptions()...)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := new(http.Protocols)
	served.SetHTTP1(true)
	served.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: served, ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		_ = srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	clientProtocols := new(http.Protocols)
	clientProtocols.SetUnencryptedHTTP2(true)
	httpClient := &http.Client{Transport: &http.Transport{Protocols: clientProtocols}}
	t.Cleanup(httpClient.CloseIdleConnections)

	for _, p := range protocols {
		for _, json := range []bool{false, true} {
			name := p.name + "/proto"
			if json {
				name = p.name + "/json"
			}
			t.Run(name, func(t *testing.T) {
				codec := &rawCodec{json: json}
				client := connect.NewClient[structpb.Struct, structpb.Struct](httpClient, "http://"+lis.Addr().String()+mapsvc.Procedure,
					append([]connect.ClientOption{connect.WithCodec(codec)}, p.opts...)...)
				before := runs.Load()
				call := func() ([]byte, bool) {
					t.Helper()
					resp, err := client.CallUnary(testCtx(t), keyedStruct(name))
					if err != nil {
						t.Fatal(err)
					}
					if len(resp.Msg.GetFields()) != mapsvc.Entries {
						t.Fatalf("response has %d entries, want %d", len(resp.Msg.GetFields()), mapsvc.Entries)
					}
					return codec.bytesOf(resp.Msg), resp.Header().Get(idemgate.ReplayedHeader) == "true"
				}
				first, replayed := call()
				if replayed {
					t.Fatal("the first call was answered as a replay")
				}
				var compact bytes.Buffer
				if json && (stdjson.Compact(&compact, first) != nil || !bytes.Equal(compact.Bytes(), first)) {
					// protojson's spacing depends on the binary: another build
					// of the tool server would replay other bytes.
					t.Fatalf("the JSON answer is not compact: %.80s...", first)
				}
				for i := range 5 {
					again, replayed := call()
					if !replayed {
						t.Fatalf("duplicate %d was not a replay", i+1)
					}
					if !bytes.Equal(again, first) {
						t.Fatalf("duplicate %d's replay differs on the wire from the first answer (%d and %d bytes)", i+1, len(again), len(first))
					}
				}
				if n := runs.Load() - before; n != 1 {
					t.Fatalf("handler ran %d times, want once", n)
				}
			})
		}
	}
}

// keyedStruct is a request carrying key in the Idempotency-Key header.
func keyedStruct(key string) *connect.Request[structpb.Struct] {
	req := connect.NewRequest(&structpb.Struct{})
	req.Header().Set(idemgate.KeyHeader, key)
	return req
}

// rawCodec is a client codec, binary protobuf ("proto") or JSON ("json"),
// that keeps the bytes each message was decoded from.
type rawCodec struct {
	json bool
	seen sync.Map // proto.Message -> []byte
}

func (c *rawCodec) Name() string {
	if c.json {
		return "json"
	}
	return "proto"
}

func (c *rawCodec) Marshal(v any) ([]byte, error) {
	if c.json {
		return protojson.Marshal(v.(proto.Message))
	}
	return proto.Marshal(v.(proto.Message))
}

func (c *rawCodec) Unmarshal(data []byte, v any) error {
	c.seen.Store(v, bytes.Clone(data))
	if c.json {
		return protojson.Unmarshal(data, v.(proto.Message))
	}
	return proto.Unmarshal(data, v.(proto.Message))
}

func (c *rawCodec) bytesOf(v proto.Message) []byte {
	b, _ := c.seen.Load(v)
	raw, _ := b.([]byte)
	return raw
}
