package dedupeapp_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// rawCodec sends the bytes it is given as they are: a client that sends
// garbage.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

var _ encoding.CodecV2 = rawCodec{}

// A malformed request is the caller's fault: INVALID_ARGUMENT, not INTERNAL.
func TestMalformedProtobufIsInvalidArgument(t *testing.T) {
	t.Parallel()
	conn := dial(t, stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir()}))
	for name, raw := range map[string][]byte{
		"non-UTF-8 scope": {0x0a, 0x02, 0xff, 0xfe},
		"truncated":       {0x0a, 0x10, 'a'},
		"bad tag":         {0x00},
	} {
		err := conn.Invoke(callCtx(t), "/idemgate.v1.DedupeService/Begin", &raw, &idemgatev1.BeginResponse{}, grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument || grpcerr.Reason(err) != dedupesvc.ReasonInvalidRequest {
			t.Errorf("%s: %v (reason %q), want INVALID_ARGUMENT %s", name, err, grpcerr.Reason(err), dedupesvc.ReasonInvalidRequest)
		}
	}
	// The service still answers well-formed calls on the same connection.
	if _, err := idemgatev1.NewDedupeServiceClient(conn).Begin(callCtx(t), beginRequest("k")); err != nil {
		t.Fatal(err)
	}
}
