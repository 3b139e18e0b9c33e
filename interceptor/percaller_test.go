package interceptor_test

import (
	"testing"

	"google.golang.org/protobuf/types/known/anypb"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// perCallerKeys are the per-caller keys every gate knows
// (internal/replayfields).
var perCallerKeys = []string{"set-cookie", "set-cookie2", "authorization-info", "proxy-authentication-info", "access-control-allow-origin"}

// TestPerCallerMetadataIsNeverStoredNorReplayed: over gRPC as over HTTP and
// Connect, the first caller gets the per-caller keys (and those of
// WithPerCallerMetadata), the stored outcome lacks them, and a duplicate
// does not get them; what every caller shares is replayed.
func TestPerCallerMetadataIsNeverStoredNorReplayed(t *testing.T) {
	t.Parallel()
	h := setup(t, interceptor.WithPerCallerMetadata("X-Caller"), interceptor.WithReplayCache(0, 0))
	req := &testingv1.MutateRequest{Payload: "me", SetHeader: []*testingv1.MetadataPair{pair("x-charge-id", []byte("ch_1")), pair("x-caller", []byte("alice"))}}
	for _, k := range perCallerKeys {
		req.SetHeader = append(req.SetHeader, pair(k, []byte("alice's "+k)))
	}
	first := h.observe(withKey("me"), h.client.Mutate, req)
	if first.err != nil {
		t.Fatal(first.err)
	}
	for _, k := range append(perCallerKeys, "x-caller") {
		if len(first.header.Get(k)) != 1 {
			t.Errorf("the first caller gets %s %q", k, first.header.Get(k))
		}
	}
	stored := &idemgatev1.StoredOutcome{}
	if err := storedOutcome(t, h, "/idemgate.testing.v1.TestService/Mutate", "me", req).UnmarshalTo(stored); err != nil {
		t.Fatal(err)
	}
	if len(stored.GetHeader()) != 1 || stored.GetHeader()[0].GetKey() != "x-charge-id" {
		t.Errorf("stored header %v, want only x-charge-id", stored.GetHeader())
	}
	again := h.observe(withKey("me"), h.client.Mutate, req)
	if again.err != nil || !replayedOnce(again.header) {
		t.Fatalf("duplicate: %v %v", again.err, again.header)
	}
	for _, k := range append(perCallerKeys, "x-caller") {
		if got := again.header.Get(k); len(got) != 0 {
			t.Errorf("a replay carries %s %q", k, got)
		}
	}
	if got := again.header.Get("x-charge-id"); len(got) != 1 || got[0] != "ch_1" {
		t.Errorf("replayed x-charge-id %q", got)
	}
}

// TestOldRecordReplaysWithoutPerCallerMetadata: a StoredOutcome an older
// gate wrote with set-cookie and a key now named per-caller replays without
// them.
func TestOldRecordReplaysWithoutPerCallerMetadata(t *testing.T) {
	t.Parallel()
	h := setup(t, interceptor.WithPerCallerMetadata("x-caller"), interceptor.WithReplayCache(0, 0))
	req := &testingv1.MutateRequest{Payload: "old"}
	result, err := anypb.New(&testingv1.MutateResponse{Payload: "old", Execution: 7, Key: "old"})
	if err != nil {
		t.Fatal(err)
	}
	storeLegacy(t, h, "/idemgate.testing.v1.TestService/Mutate", "old", req, &idemgatev1.StoredOutcome{Result: result,
		Header: []*idemgatev1.MetadataEntry{
			{Key: "set-cookie", Values: [][]byte{[]byte("sess=alice")}},
			{Key: "x-caller", Values: [][]byte{[]byte("alice")}},
			{Key: "x-charge-id", Values: [][]byte{[]byte("ch_1")}},
		},
		Trailer: []*idemgatev1.MetadataEntry{{Key: "access-control-allow-origin", Values: [][]byte{[]byte("https://alice.example")}}}})
	r := h.observe(withKey("old"), h.client.Mutate, req)
	if r.err != nil || !replayedOnce(r.header) {
		t.Fatalf("replay of an old record: %v %v", r.err, r.header)
	}
	for _, k := range []string{"set-cookie", "x-caller", "access-control-allow-origin"} {
		if len(r.header.Get(k)) != 0 || len(r.trailer.Get(k)) != 0 {
			t.Errorf("a replay of an old record carries %s: header %v trailer %v", k, r.header, r.trailer)
		}
	}
	if got := r.header.Get("x-charge-id"); len(got) != 1 {
		t.Errorf("replayed x-charge-id %q", got)
	}
	if n := h.svc.Executions(); n != 0 {
		t.Fatalf("handler ran %d times for a stored record", n)
	}
}
