package interceptor_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

// setupEmbedded is setupWith on the embedded store.
func setupEmbedded(tb testing.TB, cfg stacktest.Config) *harness {
	tb.Helper()
	h := &harness{svc: &testsvc.Server{}, codec: &recordingCodec{}}
	cfg.ToolDial = append(cfg.ToolDial, grpc.WithDefaultCallOptions(grpc.ForceCodec(h.codec)))
	h.Stack = stacktest.StartEmbedded(tb, h.register, cfg)
	h.client = testingv1.NewTestServiceClient(h.Tool)
	return h
}

// Through the in-process Dedupe client the gate behaves as through the
// network one: a call runs once, its duplicates replay its bytes, and a
// concurrent duplicate never runs it again.
func TestInProcessDedupeClient(t *testing.T) {
	t.Parallel()
	for name, start := range map[string]func(testing.TB, stacktest.Config) *harness{"postgres": setupWith, "embedded": setupEmbedded} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := start(t, stacktest.Config{InProcessDedupe: true})
			req := &testingv1.MutateRequest{Payload: "charge 4200"}
			first := h.mutate(withKey("in-process-1"), req)
			if first.err != nil || first.replayed {
				t.Fatalf("first call: err=%v replayed=%v", first.err, first.replayed)
			}
			again := h.mutate(withKey("in-process-1"), req)
			if again.err != nil || !again.replayed || !bytes.Equal(again.raw, first.raw) {
				t.Fatalf("duplicate: err=%v replayed=%v bytes=%x, want replayed %x", again.err, again.replayed, again.raw, first.raw)
			}
			reused := h.mutate(withKey("in-process-1"), &testingv1.MutateRequest{Payload: "charge 9999"})
			wantStatus(t, reused.err, codes.FailedPrecondition, idemgate.ReasonKeyReused)

			slow := &testingv1.MutateRequest{Payload: "slow", Delay: durationpb.New(300 * time.Millisecond)}
			results := make([]result, 8)
			var wg sync.WaitGroup
			for i := range results {
				wg.Go(func() { results[i] = h.mutate(withKey("in-process-2"), slow) })
			}
			wg.Wait()
			for i, r := range results {
				if r.err != nil && status.Code(r.err) != codes.Aborted {
					t.Errorf("concurrent caller %d: %v, want the response or ABORTED", i, r.err)
				}
			}
			if got := h.svc.Executions(); got != 2 {
				t.Fatalf("handler ran %d times, want 2 (once per key)", got)
			}
			if got := h.DedupeCalls.Load(); got != 0 {
				t.Errorf("the Dedupe gRPC server received %d calls, want 0: the gate must call in-process", got)
			}
		})
	}
}
