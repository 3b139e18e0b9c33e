package httpgate_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
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

// TestNoWaitAnswersADuplicateAtOnce: NoWait is max_wait 0s, which a zero
// MaxWait (the 3s default) cannot say. The gate asks the Dedupe service not
// to wait (every Begin carries max_wait 0s; without NoWait, 3s), and a
// duplicate of a held original gets 409 IDEMPOTENCY_IN_FLIGHT with
// Retry-After while the original still runs; after it, the replay.
func TestNoWaitAnswersADuplicateAtOnce(t *testing.T) {
	rec := &beginRecorder{DedupeServiceClient: dedupe(t)}
	f := setup(t, rec, httpgate.WithRoute("POST /charges", httpgate.RoutePolicy{NoWait: true}))
	if p, gated := f.gate.Policy(httptestRequest(http.MethodPost, "/charges")); !gated || !p.NoWait || p.MaxWait != 0 {
		t.Fatalf("policy %+v gated %v, want NoWait with MaxWait 0", p, gated)
	}
	release := f.held()
	first := make(chan result, 1)
	go func() { first <- post(t, f.url+"/charges", `"nowait"`, chargeBody) }()
	<-f.p.started
	dup := problem(t, post(t, f.url+"/charges", `"nowait"`, chargeBody), http.StatusConflict, idemgate.ReasonInFlight)
	if dup.RetryAfter == 0 {
		t.Errorf("IN_FLIGHT without Retry-After: %+v", dup)
	}
	release()
	if res := <-first; res.status != http.StatusCreated {
		t.Fatalf("first: %d %s", res.status, res.body)
	}
	if again := post(t, f.url+"/charges", `"nowait"`, chargeBody); again.header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("after the first: %d %v", again.status, again.header)
	}
	for i, w := range rec.recorded() {
		if w != 0 {
			t.Errorf("Begin %d asked to wait %s, want 0s", i, w)
		}
	}

	// Without NoWait, the default.
	rec = &beginRecorder{DedupeServiceClient: dedupe(t)}
	f = setup(t, rec)
	post(t, f.url+"/charges", `"wait"`, chargeBody)
	if waits := rec.recorded(); len(waits) != 1 || waits[0] != httpgate.DefaultMaxWait {
		t.Errorf("Begins waited %v, want [%s]", waits, httpgate.DefaultMaxWait)
	}
}

func TestNoWaitWithMaxWaitIsRefused(t *testing.T) {
	_, err := httpgate.New(downDedupe(t), "test-api", httpgate.WithLogger(quiet()),
		httpgate.WithRoute("POST /charges", httpgate.RoutePolicy{NoWait: true, MaxWait: time.Second}))
	if err == nil || !strings.Contains(err.Error(), "NoWait") {
		t.Fatalf("New: %v, want an error naming NoWait", err)
	}
}
