package protogate_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/internal/protogate"
)

// HasMap finds a map field at any depth, through recursive types, and only
// there.
func TestHasMap(t *testing.T) {
	for _, tt := range []struct {
		msg  proto.Message
		want bool
	}{
		{&testingv1.MutateRequest{}, true},   // labels
		{&testingv1.MutateResponse{}, false}, // scalars only
		{&structpb.Value{}, true},            // Value -> Struct -> map, recursively
		{&structpb.ListValue{}, true},        // ListValue -> Value -> Struct
		{&timestamppb.Timestamp{}, false},    // no message fields
		{&testingv1.ConformanceRequest{}, false},
	} {
		if got := protogate.HasMap(tt.msg.ProtoReflect().Descriptor()); got != tt.want {
			t.Errorf("HasMap(%s) = %v, want %v", tt.msg.ProtoReflect().Descriptor().FullName(), got, tt.want)
		}
	}
}
