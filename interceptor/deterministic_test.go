package interceptor_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/mapsvc"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// A first answer whose response is a map of 64 entries and every replay of
// it are byte-identical on the wire: the server built as docs/gating.md
// says marshals deterministically, as the stored outcome is, so neither the
// first answer nor a replay is written in Go's random map order.
func TestFirstAnswerAndReplaysOfAMapAreByteIdentical(t *testing.T) {
	t.Parallel()
	files, err := mapsvc.Files()
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	codec := &recordingCodec{}
	s := stacktest.Start(t, func(s *grpc.Server) {
		mapsvc.RegisterGRPC(s, func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
			return mapsvc.Answer(runs.Add(1)), nil
		})
	}, stacktest.Config{
		GateOptions: []interceptor.Option{interceptor.WithFiles(files), interceptor.WithLogger(discard)},
		ToolDial:    []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodec(codec))},
	})
	call := func() ([]byte, bool) {
		t.Helper()
		resp := &structpb.Struct{}
		var header metadata.MD
		if err := s.Tool.Invoke(withKey("map-1"), mapsvc.Procedure, &structpb.Struct{}, resp, grpc.Header(&header)); err != nil {
			t.Fatal(err)
		}
		if len(resp.GetFields()) != mapsvc.Entries {
			t.Fatalf("response has %d entries, want %d", len(resp.GetFields()), mapsvc.Entries)
		}
		return codec.bytesOf(resp), len(header.Get(idemgate.ReplayedHeader)) == 1
	}
	first, replayed := call()
	if replayed {
		t.Fatal("the first call was answered as a replay")
	}
	for i := range 5 {
		again, replayed := call()
		if !replayed {
			t.Fatalf("duplicate %d was not a replay", i+1)
		}
		if !bytes.Equal(again, first) {
			t.Fatalf("duplicate %d's replay differs on the wire from the first answer (%d and %d bytes, same map in another order)", i+1, len(again), len(first))
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want once", n)
	}
}

// A gated method whose response can hold a map, called on a server built
// without Gate.ServerCodec, makes the Gate warn once, naming the method;
// built with it, the Gate says nothing.
func TestAServerWithoutTheDeterministicCodecWarnsOnce(t *testing.T) {
	t.Parallel()
	files, err := mapsvc.Files()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name         string
		defaultCodec bool
		warnings     int
	}{
		{"default codec", true, 1},
		{"ServerCodec", false, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs logBuffer
			s := stacktest.Start(t, func(s *grpc.Server) {
				mapsvc.RegisterGRPC(s, func(context.Context, *structpb.Struct) (*structpb.Struct, error) { return mapsvc.Answer(1), nil })
			}, stacktest.Config{
				GateOptions:  []interceptor.Option{interceptor.WithFiles(files), interceptor.WithLogger(logs.logger())},
				DefaultCodec: tt.defaultCodec,
			})
			for _, key := range []string{"a", "b", "a"} {
				if err := s.Tool.Invoke(withKey(key), mapsvc.Procedure, &structpb.Struct{}, &structpb.Struct{}); err != nil {
					t.Fatal(err)
				}
			}
			found := logs.lines(t, "deterministic codec")
			if len(found) != tt.warnings {
				t.Fatalf("%d warnings about the codec, want %d: %v", len(found), tt.warnings, found)
			}
			for _, w := range found {
				if w["method"] != mapsvc.Procedure || w["level"] != "WARN" {
					t.Errorf("warning %v, want level WARN naming method %s", w, mapsvc.Procedure)
				}
			}
		})
	}
}
