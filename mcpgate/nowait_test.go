package mcpgate_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/mcpgate"
)

// beginRecorder records the max_wait of every Begin it passes on.
type beginRecorder struct {
	idemgatev1.DedupeServiceClient
	mu    sync.Mutex
	waits []time.Duration
}

func (b *beginRecorder) Begin(ctx context.Context, req *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	b.mu.Lock()
	wait := time.Duration(-1) // unset
	if req.GetMaxWait() != nil {
		wait = req.GetMaxWait().AsDuration()
	}
	b.waits = append(b.waits, wait)
	b.mu.Unlock()
	return b.DedupeServiceClient.Begin(ctx, req, opts...)
}

func (b *beginRecorder) recorded() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Duration(nil), b.waits...)
}

// TestNoWaitAnswersADuplicateAtOnce: ToolPolicy.NoWait is max_wait 0s,
// which a zero MaxWait (the 3s default) cannot say. Every Begin asks the
// Dedupe service not to wait (without NoWait, 3s), and a duplicate of a
// held call gets IDEMPOTENCY_IN_FLIGHT with its retry delay while the
// original still runs; after it, the replay.
func TestNoWaitAnswersADuplicateAtOnce(t *testing.T) {
	rec := &beginRecorder{DedupeServiceClient: embeddedDedupe(t)}
	ts := &tools{hold: make(chan struct{}), started: make(chan struct{}, 4), ended: make(chan error, 4)}
	f := setupTools(t, ts, rec, mcpgate.WithTool("charge", mcpgate.ToolPolicy{NoWait: true}))
	args := map[string]any{"customer": "cus_1", "amount": 500}
	first := make(chan map[string]any, 1)
	go func() { first <- structured(t, call(t, f.client, "charge", "nowait", args)) }()
	<-ts.started
	e := wantReason(t, call(t, f.client, "charge", "nowait", args), idemgate.ReasonInFlight)
	if e["retryAfterSeconds"] == nil {
		t.Errorf("IN_FLIGHT without a retry delay: %v", e)
	}
	close(ts.hold)
	want := <-first
	again := call(t, f.client, "charge", "nowait", args)
	if !replayed(again) || structured(t, again)["charge_id"] != want["charge_id"] {
		t.Fatalf("after the first: %+v", again)
	}
	for i, w := range rec.recorded() {
		if w != 0 {
			t.Errorf("Begin %d asked to wait %s, want 0s", i, w)
		}
	}

	rec = &beginRecorder{DedupeServiceClient: embeddedDedupe(t)}
	f = setup(t, rec)
	call(t, f.client, "charge", "wait", args)
	if waits := rec.recorded(); len(waits) != 1 || waits[0] != mcpgate.DefaultMaxWait {
		t.Errorf("Begins waited %v, want [%s]", waits, mcpgate.DefaultMaxWait)
	}
}

func TestNoWaitWithMaxWaitIsRefused(t *testing.T) {
	server := (&tools{}).newServer()
	_, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()),
		mcpgate.WithTool("charge", mcpgate.ToolPolicy{NoWait: true, MaxWait: time.Second}))
	if err == nil || !strings.Contains(err.Error(), "NoWait") {
		t.Fatalf("New: %v, want an error naming NoWait", err)
	}
}
