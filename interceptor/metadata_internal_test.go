package interceptor

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"

	"github.com/idemgate/idemgate"
)

// fakeStream refuses headers once they are sent, as gRPC's stream does.
type fakeStream struct {
	sent            bool
	header, trailer metadata.MD
	// refuseTrailer makes SetTrailer fail.
	refuseTrailer bool
}

func (s *fakeStream) Method() string { return "/x.S/M" }

func (s *fakeStream) SetHeader(md metadata.MD) error {
	if s.sent {
		return errors.New("headers already sent")
	}
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *fakeStream) SendHeader(md metadata.MD) error {
	if err := s.SetHeader(md); err != nil {
		return err
	}
	s.sent = true
	return nil
}

func (s *fakeStream) SetTrailer(md metadata.MD) error {
	if s.refuseTrailer {
		return errors.New("the stream is done")
	}
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}

// The recorder forwards every call unchanged and records what the handler
// set, copied, with reserved and the interceptor's keys left out, and no
// header after the header was sent (gRPC's rule, kept by the recorder).
func TestMetadataRecorderRecordsWhatTheHandlerSet(t *testing.T) {
	stream := &fakeStream{}
	ctx := grpc.NewContextWithServerTransportStream(context.Background(), stream)
	_ = grpc.SetHeader(ctx, metadata.Pairs(idemgate.KeyDerivedHeader, "true")) // before the recorder: not recorded
	ctx, rec := recordMetadata(ctx, context.Background(), nil)

	md := metadata.Pairs("x-b", "1", "grpc-custom", "no", "content-type", "no", idemgate.ReplayedHeader, "no")
	md["X-Upper"] = []string{"u"}
	if err := grpc.SetHeader(ctx, md); err != nil {
		t.Fatal(err)
	}
	md.Set("x-b", "changed after the call")
	if err := grpc.SendHeader(ctx, metadata.Pairs("x-a", "2")); err != nil {
		t.Fatal(err)
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-late", "refused")); err == nil {
		t.Fatal("SetHeader after SendHeader succeeded; the fake must refuse it")
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-t", "1", "x-t", "2", ":pseudo", "no")); err != nil {
		t.Fatal(err)
	}
	if got := stream.header.Get("x-late"); len(got) != 0 || len(stream.header.Get(idemgate.ReplayedHeader)) != 1 {
		t.Fatalf("the stream got header %v: the recorder must forward exactly what the handler set", stream.header)
	}

	result, stored := storedBy(t, rec)
	want := &idemgatev1.StoredOutcome{
		Result: result,
		Header: []*idemgatev1.MetadataEntry{
			{Key: "x-a", Values: [][]byte{[]byte("2")}},
			{Key: "x-b", Values: [][]byte{[]byte("1")}},
			{Key: "x-upper", Values: [][]byte{[]byte("u")}},
		},
		Trailer: []*idemgatev1.MetadataEntry{{Key: "x-t", Values: [][]byte{[]byte("1"), []byte("2")}}},
	}
	if !proto.Equal(stored, want) {
		t.Fatalf("stored %v, want %v", stored, want)
	}
}

// Without metadata, or without a stream, the result is stored as it is.
func TestMetadataRecorderLeavesABareResult(t *testing.T) {
	result, _ := anypb.New(&idemgatev1.ResultTooLarge{SizeBytes: 1})
	var none *metadataRecorder
	ctx, rec := recordMetadata(context.Background(), context.Background(), nil)
	if rec != nil || grpc.ServerTransportStreamFromContext(ctx) != nil {
		t.Fatal("a context without a stream got a recorder")
	}
	_, empty := recordMetadata(grpc.NewContextWithServerTransportStream(context.Background(), &fakeStream{}), context.Background(), nil)
	for _, r := range []*metadataRecorder{none, empty} {
		if got, err := r.wrap(result, nil); err != nil || got != result {
			t.Fatalf("wrap = %v, %v; want the result itself", got, err)
		}
	}
	boom := errors.New("boom")
	if _, err := empty.wrap(nil, boom); err != boom {
		t.Fatalf("wrap dropped the marshalling error: %v", err)
	}
}

// Metadata the live stream refuses while the caller is still there (an
// interceptor outside the gate sent the header already) never reached the
// caller, so no duplicate replays it: what is stored is what the caller got.
func TestMetadataRecorderDoesNotRecordWhatTheStreamRefusedTheCaller(t *testing.T) {
	stream := &fakeStream{}
	ctx := grpc.NewContextWithServerTransportStream(context.Background(), stream)
	if err := grpc.SendHeader(ctx, metadata.Pairs("x-outer", "sent")); err != nil { // outside the gate
		t.Fatal(err)
	}
	ctx, rec := recordMetadata(ctx, context.Background(), nil) // the caller stays
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-late", "refused")); err == nil {
		t.Fatal("SetHeader after the header was sent succeeded; the fake must refuse it")
	}
	if err := grpc.SendHeader(ctx, metadata.Pairs("x-late-sent", "refused")); err == nil {
		t.Fatal("SendHeader after the header was sent succeeded; the fake must refuse it")
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-t", "kept")); err != nil {
		t.Fatal(err)
	}
	stream.refuseTrailer = true
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-t", "refused", "x-u", "refused")); err == nil {
		t.Fatal("SetTrailer succeeded; the fake must refuse it")
	}

	result, stored := storedBy(t, rec)
	want := &idemgatev1.StoredOutcome{
		Result:  result,
		Trailer: []*idemgatev1.MetadataEntry{{Key: "x-t", Values: [][]byte{[]byte("kept")}}},
	}
	if !proto.Equal(stored, want) {
		t.Fatalf("stored %v, want what the caller got: %v (the stream had header %v, trailer %v)", stored, want, stream.header, stream.trailer)
	}
}

// storedBy is what rec stores for a handler result: the result and the
// StoredOutcome that wraps it with the recorded metadata.
func storedBy(t *testing.T, rec *metadataRecorder) (*anypb.Any, *idemgatev1.StoredOutcome) {
	t.Helper()
	result, _ := anypb.New(&idemgatev1.ResultTooLarge{})
	outcome, err := rec.wrap(result, nil)
	if err != nil {
		t.Fatal(err)
	}
	stored := &idemgatev1.StoredOutcome{}
	if err := outcome.UnmarshalTo(stored); err != nil {
		t.Fatal(err)
	}
	return result, stored
}
