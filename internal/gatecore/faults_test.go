package gatecore_test

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
)

// embeddedDedupe is a real Dedupe service on the embedded store, called in
// process.
func embeddedDedupe(t *testing.T) idemgatev1.DedupeServiceClient {
	t.Helper()
	store, err := sqlitestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatalf("open the embedded store: %v", err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv := dedupesvc.NewServer(store, dedupesvc.WithNotifier(store), dedupesvc.WithLogger(discard()))
	return dedupesvc.NewInProcessClient(srv)
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// faultyDedupe passes every call to a real Dedupe service, except where a
// hook says otherwise.
type faultyDedupe struct {
	idemgatev1.DedupeServiceClient
	mu       sync.Mutex
	finishes int
	// finish, when set, makes the n-th Finish (from 1): it may send it
	// (forward) and answer anything.
	finish func(n int, forward func() error) error
}

func (d *faultyDedupe) Finish(ctx context.Context, req *idemgatev1.FinishRequest, opts ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	d.mu.Lock()
	d.finishes++
	n, hook := d.finishes, d.finish
	d.mu.Unlock()
	forward := func() error {
		_, err := d.DedupeServiceClient.Finish(ctx, req, opts...)
		return err
	}
	if hook == nil {
		return &idemgatev1.FinishResponse{}, forward()
	}
	if err := hook(n, forward); err != nil {
		return nil, err
	}
	return &idemgatev1.FinishResponse{}, nil
}

func testCall(key string, retention time.Duration) *gatecore.Call {
	fp := sha256.Sum256([]byte("request"))
	return gatecore.NewCall("tool", "scope", key, fp[:], gatecore.Policy{Lease: time.Minute, ExecutionTimeout: time.Minute}, retention)
}

func testOutcome() *anypb.Any {
	return &anypb.Any{TypeUrl: "type.googleapis.com/test.Outcome", Value: []byte("done")}
}

// A Finish whose first answer was lost after it stored the outcome, and
// that was retried later, must not date the record from the retry: the
// replay cache serves an outcome until Stored's time plus the retention,
// and the record expires that long after the first Finish stored it.
func TestAFinishRetriedAfterALostAnswerDatesTheRecordFromTheFirstSend(t *testing.T) {
	var firstSent time.Time
	d := &faultyDedupe{DedupeServiceClient: embeddedDedupe(t)}
	d.finish = func(n int, forward func() error) error {
		if n == 1 {
			firstSent = time.Now() // read by the test after Close, which waits for the retry
			if err := forward(); err != nil {
				t.Errorf("the first Finish: %v", err)
			}
			return status.Error(codes.Unavailable, "the connection broke after the outcome was stored")
		}
		return forward()
	}
	e := gatecore.New(d, gatecore.Options{Logger: discard()})
	const retention = time.Hour
	c := testCall("lost-finish-answer", retention)
	var stored []time.Time
	c.Stored = func(_ *anypb.Any, sent time.Time) { stored = append(stored, sent) }

	ctx := context.Background()
	b, err := e.Begin(ctx, c)
	if err != nil || b.Kind != gatecore.Reserved {
		t.Fatalf("Begin = %v, %v; want reserved", b.Kind, err)
	}
	if fenced := e.Start(ctx, c, b).Finish(testOutcome(), false); fenced {
		t.Fatal("Finish reported fenced")
	}
	closeCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := e.Close(closeCtx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if len(stored) != 1 {
		t.Fatalf("Stored told %d times, want once", len(stored))
	}
	if stored[0].After(firstSent) {
		t.Errorf("Stored dates the outcome from %v, %v after the first Finish, which stored it, was sent: a cached replay outlives its record by that much",
			stored[0].Format(time.RFC3339Nano), stored[0].Sub(firstSent))
	}
	// The service's own expiry (whole milliseconds) is no earlier than the
	// estimate.
	again, err := gatecore.New(d, gatecore.Options{Logger: discard()}).Begin(ctx, testCall("lost-finish-answer", retention))
	if err != nil || again.Kind != gatecore.Completed {
		t.Fatalf("Begin again = %v, %v; want completed", again.Kind, err)
	}
	if estimate := stored[0].Add(retention); estimate.After(again.ExpiresAt.Add(time.Millisecond)) {
		t.Errorf("the estimated expiry %v is after the record's %v", estimate.Format(time.RFC3339Nano), again.ExpiresAt.Format(time.RFC3339Nano))
	}
}

// Once Close began a Finish is still retried, in its caller's goroutine
// before the answer, within the budget: a transient failure during a
// shutdown must not lose an outcome that a retry stores.
func TestAFinishAfterCloseBeganIsRetried(t *testing.T) {
	d := &faultyDedupe{DedupeServiceClient: embeddedDedupe(t)}
	d.finish = func(n int, forward func() error) error {
		if n == 1 {
			return status.Error(codes.Unavailable, "the Dedupe service is restarting")
		}
		return forward()
	}
	e := gatecore.New(d, gatecore.Options{Logger: discard()})
	c := testCall("finish-after-close", time.Hour)
	ctx := context.Background()
	b, err := e.Begin(ctx, c)
	if err != nil || b.Kind != gatecore.Reserved {
		t.Fatalf("Begin = %v, %v; want reserved", b.Kind, err)
	}
	a := e.Start(ctx, c, b)
	if err := e.Close(ctx); err != nil { // nothing in the background yet
		t.Fatalf("Close: %v", err)
	}
	if fenced := a.Finish(testOutcome(), false); fenced {
		t.Fatal("Finish reported fenced")
	}
	again, err := gatecore.New(d, gatecore.Options{Logger: discard()}).Begin(ctx, testCall("finish-after-close", time.Hour))
	if err != nil || again.Kind != gatecore.Completed {
		t.Fatalf("after Finish returned, Begin = kind %v, %v; want the outcome completed (Stats %+v)", again.Kind, err, e.Stats())
	}
	if s := e.Stats(); s.OutcomesLost != 0 || s.FinishRetries != 1 {
		t.Errorf("Stats = %+v, want no outcome lost and one Finish retry", s)
	}
}

// The retries a caller makes once Close began stop when Close's context
// ends, even after Close returned: the outcome is then given up and counted,
// and the caller, whose outcome the store never took, gets the fenced
// answer rather than its own.
func TestAFinishAfterCloseBeganStopsWithClosesContext(t *testing.T) {
	retried := make(chan struct{})
	d := &faultyDedupe{DedupeServiceClient: embeddedDedupe(t)}
	d.finish = func(n int, _ func() error) error {
		if n == 2 {
			close(retried)
		}
		return status.Error(codes.Unavailable, "the Dedupe service is down")
	}
	e := gatecore.New(d, gatecore.Options{Logger: discard()})
	c := testCall("finish-after-close-cut-off", time.Hour)
	b, err := e.Begin(context.Background(), c)
	if err != nil || b.Kind != gatecore.Reserved {
		t.Fatalf("Begin = %v, %v; want reserved", b.Kind, err)
	}
	a := e.Start(context.Background(), c, b)
	closeCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := e.Close(closeCtx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	finished := make(chan bool)
	go func() { finished <- a.Finish(testOutcome(), false) }()
	<-retried
	cancel()
	if fenced := <-finished; !fenced {
		t.Fatal("Finish answered the caller with an outcome that was never stored")
	}
	if s := e.Stats(); s.OutcomesLost != 1 {
		t.Errorf("OutcomesLost = %d, want the outcome given up once Close's context ended", s.OutcomesLost)
	}
}
