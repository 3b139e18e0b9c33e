package connectgate_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// storingDedupe is the Dedupe service, the outcomes the gate stores kept
// for the test; rewrite, when set, changes a StoredOutcome before it is
// stored (as an older gate would have written it).
type storingDedupe struct {
	idemgatev1.DedupeServiceClient
	mu       sync.Mutex
	outcomes []*anypb.Any
	rewrite  func(*idemgatev1.StoredOutcome)
}

func (d *storingDedupe) Finish(ctx context.Context, in *idemgatev1.FinishRequest, opts ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	if d.rewrite != nil {
		stored := &idemgatev1.StoredOutcome{}
		if err := in.GetOutcome().UnmarshalTo(stored); err == nil {
			d.rewrite(stored)
			in = proto.Clone(in).(*idemgatev1.FinishRequest)
			in.Outcome, _ = anypb.New(stored)
		}
	}
	d.mu.Lock()
	d.outcomes = append(d.outcomes, in.GetOutcome())
	d.mu.Unlock()
	return d.DedupeServiceClient.Finish(ctx, in, opts...)
}

// storedKeys are the metadata keys of every outcome stored so far.
func (d *storingDedupe) storedKeys(t *testing.T) map[string]bool {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.outcomes) == 0 {
		t.Fatal("no outcome was stored")
	}
	keys := map[string]bool{}
	for _, o := range d.outcomes {
		stored := &idemgatev1.StoredOutcome{}
		if o.UnmarshalTo(stored) != nil {
			continue // a bare result: no metadata
		}
		for _, e := range append(stored.GetHeader(), stored.GetTrailer()...) {
			keys[e.GetKey()] = true
		}
	}
	return keys
}

// perCaller are the per-caller fields every gate knows
// (internal/replayfields), lowercase as stored.
var perCaller = []string{"set-cookie", "set-cookie2", "authorization-info", "proxy-authentication-info",
	"access-control-allow-origin", "access-control-allow-credentials"}

func perCallerRequest() *testingv1.MutateRequest {
	msg := &testingv1.MutateRequest{Payload: "me", SetHeader: []*testingv1.MetadataPair{
		{Key: "x-charge-id", Value: []byte("ch_1")}, {Key: "x-caller", Value: []byte("alice")},
		{Key: "cache-control", Value: []byte("private")}}}
	for _, k := range perCaller {
		msg.SetHeader = append(msg.SetHeader, &testingv1.MetadataPair{Key: k, Value: []byte("alice's " + k)})
	}
	return msg
}

// TestPerCallerHeadersAreNeverStoredNorReplayed: bob, with alice's key and
// message, gets her response but not her Set-Cookie, CORS grant or auth
// info, over every protocol; none of them is in the stored record. The
// first caller gets them.
func TestPerCallerHeadersAreNeverStoredNorReplayed(t *testing.T) {
	t.Parallel()
	d := &storingDedupe{}
	hs := setupWrapped(t, nil, func(c idemgatev1.DedupeServiceClient) idemgatev1.DedupeServiceClient {
		d.DedupeServiceClient = c
		return d
	}, connectgate.WithReplayCache(0, 0))
	ctx := testCtx(t)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			client := hs.client(p.opts...)
			alice, err := client.Mutate(ctx, keyed("me-"+p.name, perCallerRequest()))
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range perCaller {
				if alice.Header().Get(k) != "alice's "+k {
					t.Errorf("the first caller gets %s %q", k, alice.Header().Get(k))
				}
			}
			bob, err := client.Mutate(ctx, keyed("me-"+p.name, perCallerRequest()))
			if err != nil {
				t.Fatal(err)
			}
			if bob.Header().Get(idemgate.ReplayedHeader) != "true" || bob.Header().Get("X-Charge-Id") != "ch_1" || bob.Header().Get("Cache-Control") != "private" {
				t.Fatalf("bob's headers %v: want a replay with x-charge-id and cache-control", bob.Header())
			}
			for _, k := range perCaller {
				if got := bob.Header().Values(k); len(got) != 0 {
					t.Errorf("a replay carries %s %q", k, got)
				}
			}
			if bob.Header().Get("X-Caller") != "alice" {
				t.Errorf("x-caller, not named per-caller, is not replayed: %v", bob.Header())
			}
		})
	}
	stored := d.storedKeys(t)
	for _, k := range perCaller {
		if stored[k] {
			t.Errorf("%s is in the stored record", k)
		}
	}
}

// TestWithPerCallerHeaders: a header the operator names is per-caller too,
// and a record of the old shape that holds per-caller headers replays
// without them.
func TestWithPerCallerHeaders(t *testing.T) {
	t.Parallel()
	d := &storingDedupe{}
	hs := setupWrapped(t, nil, func(c idemgatev1.DedupeServiceClient) idemgatev1.DedupeServiceClient {
		d.DedupeServiceClient = c
		return d
	}, connectgate.WithReplayCache(0, 0), connectgate.WithPerCallerHeaders("X-Caller"))
	ctx := testCtx(t)
	client := hs.client()
	alice, err := client.Mutate(ctx, keyed("named", perCallerRequest()))
	if err != nil {
		t.Fatal(err)
	}
	if alice.Header().Get("X-Caller") != "alice" {
		t.Fatalf("the first caller gets x-caller %q", alice.Header().Get("X-Caller"))
	}
	bob, err := client.Mutate(ctx, keyed("named", perCallerRequest()))
	if err != nil {
		t.Fatal(err)
	}
	if bob.Header().Get(idemgate.ReplayedHeader) != "true" || len(bob.Header().Values("X-Caller")) != 0 {
		t.Fatalf("bob's headers %v: want a replay without x-caller", bob.Header())
	}
	if d.storedKeys(t)["x-caller"] {
		t.Error("x-caller is in the stored record")
	}

	// An older gate stored set-cookie and x-caller.
	d.rewrite = func(s *idemgatev1.StoredOutcome) {
		s.Header = append(s.Header, &idemgatev1.MetadataEntry{Key: "set-cookie", Values: [][]byte{[]byte("sess=alice")}},
			&idemgatev1.MetadataEntry{Key: "x-caller", Values: [][]byte{[]byte("alice")}})
		s.Trailer = append(s.Trailer, &idemgatev1.MetadataEntry{Key: "access-control-allow-origin", Values: [][]byte{[]byte("https://alice.example")}})
	}
	if _, err := client.Mutate(ctx, keyed("old", perCallerRequest())); err != nil {
		t.Fatal(err)
	}
	if !d.storedKeys(t)["set-cookie"] {
		t.Fatal("the old-shape record was not stored")
	}
	bob, err = client.Mutate(ctx, keyed("old", perCallerRequest()))
	if err != nil {
		t.Fatal(err)
	}
	if bob.Header().Get(idemgate.ReplayedHeader) != "true" || bob.Header().Get("X-Charge-Id") != "ch_1" {
		t.Fatalf("replay of an old record: %v", bob.Header())
	}
	for _, k := range []string{"set-cookie", "x-caller", "access-control-allow-origin"} {
		if len(bob.Header().Values(k)) != 0 || len(bob.Trailer().Values(k)) != 0 {
			t.Errorf("a replay of an old record carries %s: header %v trailer %v", k, bob.Header(), bob.Trailer())
		}
	}
}
