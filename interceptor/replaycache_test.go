package interceptor_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// countingDedupe counts the RPCs the gate sends the Dedupe service.
func countingDedupe(n *atomic.Int64) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func TestReplayCacheAnswersWithoutDedupeCalls(t *testing.T) {
	t.Parallel()
	var rpcs atomic.Int64
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: countingDedupe(&rpcs),
		GateOptions: []interceptor.Option{interceptor.WithReplayCache(100, 1<<20)}})
	req := &testingv1.MutateRequest{Payload: "charge 4200", SetHeader: []*testingv1.MetadataPair{pair("x-receipt", []byte("r-1"))}}

	first := h.mutate(withKey("cached-1"), req)
	if first.err != nil {
		t.Fatal(first.err)
	}
	before := rpcs.Load()
	for range 3 {
		var header grpcHeader
		resp, err := h.client.Mutate(withKey("cached-1"), req, grpc.Header(&header.MD))
		if err != nil {
			t.Fatal(err)
		}
		if raw := h.codec.bytesOf(resp); !bytes.Equal(raw, first.raw) {
			t.Fatalf("cached replay bytes %x, want %x", raw, first.raw)
		}
		if got := header.Get(idemgate.ReplayedHeader); len(got) != 1 || got[0] != "true" {
			t.Errorf("replayed header = %q, want true", got)
		}
		if got := header.Get("x-receipt"); len(got) != 1 || got[0] != "r-1" {
			t.Errorf("stored header x-receipt = %q, want r-1", got)
		}
	}
	if got := rpcs.Load() - before; got != 0 {
		t.Errorf("the duplicates sent %d Dedupe RPCs, want 0", got)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
	if s := h.Gate.Stats(); s.ReplayCacheHits != 3 || s.ReplayCacheMisses != 1 {
		t.Errorf("hits, misses = %d, %d; want 3, 1", s.ReplayCacheHits, s.ReplayCacheMisses)
	}

	// Another request under the key still reaches the service, which
	// refuses it.
	reused := h.mutate(withKey("cached-1"), &testingv1.MutateRequest{Payload: "charge 9999"})
	wantStatus(t, reused.err, codes.FailedPrecondition, idemgate.ReasonKeyReused)
	if rpcs.Load() == before {
		t.Error("a request with another fingerprint was answered without asking the Dedupe service")
	}
}

// A replay the service answered fills the cache too: a second replica's
// first duplicate asks the service, the next ones do not.
func TestReplayCacheFilledByCompletedBegin(t *testing.T) {
	t.Parallel()
	var rpcs atomic.Int64
	cfg := stacktest.Config{DedupeClientInterceptor: countingDedupe(&rpcs), GateOptions: []interceptor.Option{interceptor.WithReplayCache(100, 1<<20)}}
	h := setupWith(t, stacktest.Config{})
	req := &testingv1.MutateRequest{Payload: "charge 4200"}
	first := h.mutate(withKey("cached-2"), req)
	if first.err != nil {
		t.Fatal(first.err)
	}
	conn, _ := h.SecondTool(t, h.register, cfg)
	second := testingv1.NewTestServiceClient(conn)
	for i := range 3 {
		before := rpcs.Load()
		if _, err := second.Mutate(withKey("cached-2"), req); err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		if i == 0 {
			want = 1 // the Begin that answers completed and fills the cache
		}
		if got := rpcs.Load() - before; got != want {
			t.Errorf("duplicate %d sent %d Dedupe RPCs, want %d", i, got, want)
		}
	}
}

// Past the cache's TTL the service is asked again.
func TestReplayCacheTTL(t *testing.T) {
	t.Parallel()
	var rpcs atomic.Int64
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: countingDedupe(&rpcs),
		GateOptions: []interceptor.Option{interceptor.WithReplayCache(100, 1<<20), interceptor.WithReplayCacheTTL(time.Millisecond)}})
	req := &testingv1.MutateRequest{Payload: "charge 4200"}
	if r := h.mutate(withKey("cached-3"), req); r.err != nil {
		t.Fatal(r.err)
	}
	time.Sleep(5 * time.Millisecond) // past the TTL whatever the load: nothing asserts how long anything took
	before := rpcs.Load()
	if r := h.mutate(withKey("cached-3"), req); r.err != nil || !r.replayed {
		t.Fatalf("duplicate: %v, replayed=%v", r.err, r.replayed)
	}
	if rpcs.Load() == before {
		t.Error("a duplicate past the TTL was answered from the cache")
	}
}
