package interceptor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"slices"
	"strings"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// rpc is one of the test service's unary methods on the client.
type rpc func(context.Context, *testingv1.MutateRequest, ...grpc.CallOption) (*testingv1.MutateResponse, error)

// observed is everything a caller saw of one call.
type observed struct {
	raw             []byte
	err             error
	header, trailer metadata.MD
}

func (h *harness) observe(ctx context.Context, call rpc, req *testingv1.MutateRequest) observed {
	var o observed
	resp, err := call(ctx, req, grpc.Header(&o.header), grpc.Trailer(&o.trailer))
	o.err = err
	if resp != nil {
		o.raw = h.codec.bytesOf(resp)
	}
	return o
}

// handlerSet is md without what gRPC and the interceptor put there
// themselves: what the handler set.
func handlerSet(md metadata.MD) metadata.MD {
	out := metadata.MD{}
	for k, v := range md {
		if strings.HasPrefix(k, "grpc-") || k == "content-type" || k == idemgate.ReplayedHeader || k == idemgate.KeyDerivedHeader ||
			k == idemgate.ExpiresAtHeader || k == idemgate.OriginalTimeHeader {
			continue
		}
		out[k] = v
	}
	return out
}

func pair(key string, value []byte) *testingv1.MetadataPair {
	return &testingv1.MetadataPair{Key: key, Value: value}
}

// withMetadata asks the handler to set two values of one header, a binary
// header that is not UTF-8, and two trailers, one binary.
func withMetadata(req *testingv1.MutateRequest) *testingv1.MutateRequest {
	req.SetHeader = []*testingv1.MetadataPair{
		pair("x-charge-id", []byte("ch_1")),
		pair("x-charge-id", []byte("ch_2")),
		pair("x-signature-bin", []byte{0xff, 0x00, 0xfe, 0x80}),
	}
	req.SetTrailer = []*testingv1.MetadataPair{
		pair("x-ledger-entry", []byte("entry-7")),
		pair("x-checksum-bin", []byte{0xc3, 0x28, 0x00}),
	}
	return req
}

// wantHandlerMetadata fails unless o carries exactly what withMetadata asks.
func wantHandlerMetadata(t *testing.T, what string, o observed) {
	t.Helper()
	wantHeader := metadata.MD{"x-charge-id": {"ch_1", "ch_2"}, "x-signature-bin": {"\xff\x00\xfe\x80"}}
	wantTrailer := metadata.MD{"x-ledger-entry": {"entry-7"}, "x-checksum-bin": {"\xc3\x28\x00"}}
	if got := handlerSet(o.header); !reflect.DeepEqual(got, wantHeader) {
		t.Errorf("%s: header %q, want %q", what, map[string][]string(got), map[string][]string(wantHeader))
	}
	if got := handlerSet(o.trailer); !reflect.DeepEqual(got, wantTrailer) {
		t.Errorf("%s: trailer %q, want %q", what, map[string][]string(got), map[string][]string(wantTrailer))
	}
}

func replayedOnce(md metadata.MD) bool {
	return slices.Equal(md.Get(idemgate.ReplayedHeader), []string{"true"})
}

// storedOutcome reads the outcome stored for key as another attempt's Begin
// would find it.
func storedOutcome(t *testing.T, h *harness, fullMethod, key string, req *testingv1.MutateRequest) *anypb.Any {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256(b)
	res, err := h.Dedupe.Begin(context.Background(), &idemgatev1.BeginRequest{
		Scope: fullMethod, Key: key, Fingerprint: fp[:], AttemptToken: "inspector",
		Lease: durationpb.New(interceptor.DefaultLease), Retention: durationpb.New(interceptor.DefaultRetention),
	})
	if err != nil || res.GetCompleted() == nil {
		t.Fatalf("Begin = %v, %v; want the completed record", res, err)
	}
	return res.GetCompleted().GetOutcome()
}

// storeLegacy stores outcome for key the way a version without metadata
// replay did: a bare Any through Begin and Finish.
func storeLegacy(t *testing.T, h *harness, fullMethod, key string, req *testingv1.MutateRequest, outcome proto.Message) *anypb.Any {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256(b)
	begun, err := h.Dedupe.Begin(context.Background(), &idemgatev1.BeginRequest{
		Scope: fullMethod, Key: key, Fingerprint: fp[:], AttemptToken: "older-binary-" + key,
		Lease: durationpb.New(interceptor.DefaultLease), Retention: durationpb.New(interceptor.DefaultRetention),
	})
	if err != nil || begun.GetReserved() == nil {
		t.Fatalf("Begin = %v, %v; want reserved", begun, err)
	}
	stored := &anypb.Any{}
	if err := anypb.MarshalFrom(stored, outcome, proto.MarshalOptions{Deterministic: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Dedupe.Finish(context.Background(), &idemgatev1.FinishRequest{
		Scope: fullMethod, Key: key, AttemptToken: "older-binary-" + key, Epoch: begun.GetReserved().GetEpoch(), Outcome: stored,
	}); err != nil {
		t.Fatal(err)
	}
	return stored
}

// A duplicate sees the header and trailer the handler set, byte for byte,
// with the same response bytes, whether the handler set its header or sent it.
func TestReplayCarriesHandlerMetadata(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for _, send := range []bool{false, true} {
		name := map[bool]string{false: "SetHeader", true: "SendHeader"}[send]
		t.Run(name, func(t *testing.T) {
			key := "meta-" + name
			req := withMetadata(&testingv1.MutateRequest{Payload: "charge 4200", SendHeader: send})
			before := h.svc.Executions()
			first := h.observe(withKey(key), h.client.Mutate, req)
			if first.err != nil {
				t.Fatal(first.err)
			}
			wantHandlerMetadata(t, "first call", first)
			for range 2 {
				again := h.observe(withKey(key), h.client.Mutate, req)
				if again.err != nil {
					t.Fatal(again.err)
				}
				if !replayedOnce(again.header) {
					t.Errorf("duplicate header %s = %q, want one \"true\"", idemgate.ReplayedHeader, again.header.Get(idemgate.ReplayedHeader))
				}
				if !bytes.Equal(again.raw, first.raw) {
					t.Errorf("replay bytes %x, want %x", again.raw, first.raw)
				}
				wantHandlerMetadata(t, "duplicate", again)
			}
			if ran := h.svc.Executions() - before; ran != 1 {
				t.Fatalf("handler ran %d times, want 1", ran)
			}
		})
	}
}

// A final error is replayed with the header and trailer the handler set
// before it failed, whether replay_codes or FinalError made it final.
func TestReplayedFinalErrorCarriesMetadata(t *testing.T) {
	t.Parallel()
	h := setup(t)
	tests := []struct {
		name string
		call rpc
		req  *testingv1.MutateRequest
	}{
		{"replay code", h.client.MutateReplayErrors, &testingv1.MutateRequest{FailCode: int32(codes.InvalidArgument), FailDetail: "CARD_DECLINED"}},
		{"FinalError", h.client.Mutate, &testingv1.MutateRequest{FailCode: int32(codes.Unavailable), FailMark: testingv1.ErrorMark_ERROR_MARK_FINAL}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "meta-error-" + string(rune('a'+i))
			req := withMetadata(tt.req)
			before := h.svc.Executions()
			first := h.observe(withKey(key), tt.call, req)
			again := h.observe(withKey(key), tt.call, req)
			if status.Code(first.err) != codes.Code(req.GetFailCode()) {
				t.Fatalf("first call: %v, want code %v", first.err, codes.Code(req.GetFailCode()))
			}
			wantHandlerMetadata(t, "first call", first)
			firstStatus, _ := proto.MarshalOptions{Deterministic: true}.Marshal(status.Convert(first.err).Proto())
			againStatus, _ := proto.MarshalOptions{Deterministic: true}.Marshal(status.Convert(again.err).Proto())
			if !bytes.Equal(firstStatus, againStatus) {
				t.Errorf("replayed error %v, want the byte-identical %v", again.err, first.err)
			}
			if !replayedOnce(again.header) {
				t.Errorf("duplicate header %s = %q, want one \"true\"", idemgate.ReplayedHeader, again.header.Get(idemgate.ReplayedHeader))
			}
			wantHandlerMetadata(t, "duplicate", again)
			if ran := h.svc.Executions() - before; ran != 1 {
				t.Fatalf("handler ran %d times, want 1", ran)
			}
		})
	}
}

// Records stored before metadata was kept, a bare response or a bare
// google.rpc.Status, replay as they always did.
func TestLegacyOutcomeStillReplays(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const mutate = "/idemgate.testing.v1.TestService/Mutate"

	req := withMetadata(&testingv1.MutateRequest{Payload: "stored by an older binary"})
	stored := storeLegacy(t, h, mutate, "legacy-response", req, &testingv1.MutateResponse{Payload: "stored by an older binary", Execution: 41, Key: "legacy-response"})
	r := h.observe(withKey("legacy-response"), h.client.Mutate, req)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !replayedOnce(r.header) || !bytes.Equal(r.raw, stored.GetValue()) {
		t.Fatalf("replayed=%v bytes %x, want the stored %x replayed", replayedOnce(r.header), r.raw, stored.GetValue())
	}
	if got := handlerSet(r.header); len(got) != 0 {
		t.Errorf("a legacy record replayed header %q, want none", map[string][]string(got))
	}

	errReq := &testingv1.MutateRequest{Payload: "declined by an older binary"}
	storeLegacy(t, h, mutate, "legacy-error", errReq, &spb.Status{Code: int32(codes.FailedPrecondition), Message: "card declined"})
	e := h.observe(withKey("legacy-error"), h.client.Mutate, errReq)
	if st := status.Convert(e.err); st.Code() != codes.FailedPrecondition || st.Message() != "card declined" || !replayedOnce(e.header) {
		t.Fatalf("legacy error replayed as %v (replayed=%v), want FAILED_PRECONDITION card declined", e.err, replayedOnce(e.header))
	}
	if got := handlerSet(e.trailer); len(got) != 0 {
		t.Errorf("a legacy error replayed trailer %q, want none", map[string][]string(got))
	}
	if n := h.svc.Executions(); n != 0 {
		t.Fatalf("handler ran %d times for stored records, want 0", n)
	}
}

// The stored outcome holds what the handler set, sorted and without the
// interceptor's own headers or reserved keys, and deterministically encoded;
// a duplicate carries the interceptor's headers once each.
func TestStoredOutcomeHoldsOnlyHandlerMetadata(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{
		Payload: "keyless",
		SetHeader: []*testingv1.MetadataPair{
			pair("x-b", []byte("2")), pair("x-a", []byte("1")), pair("grpc-custom", []byte("reserved")), pair("x-b", []byte("1")),
		},
		SetTrailer: []*testingv1.MetadataPair{pair("x-t", []byte("t"))},
	}
	first := h.observe(context.Background(), h.client.MutateKeyless, req)
	if first.err != nil {
		t.Fatal(first.err)
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	fp := sha256.Sum256(b)
	outcome := storedOutcome(t, h, "/idemgate.testing.v1.TestService/MutateKeyless", "derived:"+hex.EncodeToString(fp[:]), req)

	stored := &idemgatev1.StoredOutcome{}
	if err := outcome.UnmarshalTo(stored); err != nil {
		t.Fatalf("stored outcome is a %s: %v; want an idemgate.v1.StoredOutcome", outcome.MessageName(), err)
	}
	want := &idemgatev1.StoredOutcome{
		Header: []*idemgatev1.MetadataEntry{
			{Key: "x-a", Values: [][]byte{[]byte("1")}},
			{Key: "x-b", Values: [][]byte{[]byte("2"), []byte("1")}},
		},
		Trailer: []*idemgatev1.MetadataEntry{{Key: "x-t", Values: [][]byte{[]byte("t")}}},
	}
	if !proto.Equal(&idemgatev1.StoredOutcome{Header: stored.GetHeader(), Trailer: stored.GetTrailer()}, want) {
		t.Errorf("stored metadata %v, want %v", stored, want)
	}
	if stored.GetResult().MessageName() != "idemgate.testing.v1.MutateResponse" || !bytes.Equal(stored.GetResult().GetValue(), first.raw) {
		t.Errorf("stored result %s %x, want the response %x", stored.GetResult().MessageName(), stored.GetResult().GetValue(), first.raw)
	}
	deterministic, _ := proto.MarshalOptions{Deterministic: true}.Marshal(stored)
	if !bytes.Equal(outcome.GetValue(), deterministic) {
		t.Error("the stored outcome is not deterministically encoded")
	}

	again := h.observe(context.Background(), h.client.MutateKeyless, req)
	if again.err != nil || !bytes.Equal(again.raw, first.raw) {
		t.Fatalf("duplicate: %v, bytes %x, want %x", again.err, again.raw, first.raw)
	}
	if !replayedOnce(again.header) || !slices.Equal(again.header.Get(idemgate.KeyDerivedHeader), []string{"true"}) {
		t.Errorf("duplicate header %q, want one %s and one %s", map[string][]string(again.header), idemgate.ReplayedHeader, idemgate.KeyDerivedHeader)
	}
	if got, want := handlerSet(again.header), (metadata.MD{"x-a": {"1"}, "x-b": {"2", "1"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("duplicate header %q, want %q", map[string][]string(got), map[string][]string(want))
	}
}

// A handler that sets no metadata stores the bare response, the same bytes
// as before metadata was kept.
func TestHandlerWithoutMetadataStoresTheBareOutcome(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{Payload: "no metadata"}
	first := h.observe(withKey("bare"), h.client.Mutate, req)
	if first.err != nil {
		t.Fatal(first.err)
	}
	outcome := storedOutcome(t, h, "/idemgate.testing.v1.TestService/Mutate", "bare", req)
	if outcome.MessageName() != "idemgate.testing.v1.MutateResponse" || !bytes.Equal(outcome.GetValue(), first.raw) {
		t.Fatalf("stored %s %x, want the bare response %x", outcome.MessageName(), outcome.GetValue(), first.raw)
	}
}

// The size limit counts the metadata: an outcome whose response fits but
// whose metadata does not is replaced by the marker, which carries no
// metadata and names the response's type.
func TestOutcomeLimitCountsMetadata(t *testing.T) {
	t.Parallel()
	h := setup(t, interceptor.WithMaxOutcomeBytes(1024))
	req := &testingv1.MutateRequest{
		Payload:   strings.Repeat("p", 600),
		SetHeader: []*testingv1.MetadataPair{pair("x-big", bytes.Repeat([]byte("h"), 600))},
	}
	first := h.observe(withKey("big-meta"), h.client.Mutate, req)
	if first.err != nil || len(first.header.Get("x-big")) != 1 {
		t.Fatalf("first call: %v, header %q; want the response and its header", first.err, map[string][]string(first.header))
	}
	again := h.observe(withKey("big-meta"), h.client.Mutate, req)
	wantStatus(t, again.err, codes.FailedPrecondition, idemgate.ReasonResultTooLarge)
	if got := handlerSet(again.header); len(got) != 0 {
		t.Errorf("a too-large outcome replayed header %q, want none", map[string][]string(got))
	}
	marker := &idemgatev1.ResultTooLarge{}
	if err := storedOutcome(t, h, "/idemgate.testing.v1.TestService/Mutate", "big-meta", req).UnmarshalTo(marker); err != nil {
		t.Fatal(err)
	}
	if marker.GetTypeUrl() != "type.googleapis.com/idemgate.testing.v1.MutateResponse" {
		t.Errorf("marker names %q, want the response type", marker.GetTypeUrl())
	}
}
