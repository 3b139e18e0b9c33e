package dedupesvc_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// countingStore is a ReplayCounter that keeps every batch it was given.
type countingStore struct {
	mu      sync.Mutex
	batches [][]dedupesvc.ReplayCount
	err     error
}

func (c *countingStore) AddReplays(_ context.Context, counts []dedupesvc.ReplayCount) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches = append(c.batches, counts)
	return len(counts), c.err
}

// Replays are counted per method and per record, and a flush sends one
// batch with one count per record.
func TestReplaysAreCountedPerMethodAndPerRecord(t *testing.T) {
	t.Parallel()
	completedAt := time.Date(2026, 11, 30, 10, 0, 0, 123456000, time.UTC)
	store := &fakeStore{begin: dedupesvc.BeginResult{State: dedupesvc.BeginCompleted, CompletedAt: completedAt, ExpiresAt: completedAt.Add(time.Hour),
		Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/x.Y", Value: []byte("v")}}}
	counter := &countingStore{}
	m := dedupesvc.NewMetrics()
	recorder := dedupesvc.NewReplayRecorder(counter, dedupesvc.ReplayRecorderConfig{Metrics: m})
	srv := dedupesvc.NewServer(store, dedupesvc.WithMetrics(m), dedupesvc.WithReplayRecorder(recorder))
	ctx := context.Background()
	for _, scope := range []string{"/pkg.S/Charge|tenant-1", "/pkg.S/Charge|tenant-1", "/pkg.S/Charge|tenant-2", "/pkg.S/Send"} {
		req := validBegin()
		req.Scope = scope
		if _, err := srv.Begin(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	store.begin = dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: 1}
	if _, err := srv.Begin(ctx, validBegin()); err != nil { // not a replay
		t.Fatal(err)
	}

	want := `
# HELP idemgate_dedupe_replays_total Duplicates answered with a stored outcome (suppressed executions), by method (the scope's action; at most 100 methods added by each caller and 500 in all, then "other").
# TYPE idemgate_dedupe_replays_total counter
idemgate_dedupe_replays_total{method="/pkg.S/Charge"} 3
idemgate_dedupe_replays_total{method="/pkg.S/Send"} 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "idemgate_dedupe_replays_total"); err != nil {
		t.Fatal(err)
	}
	if got := recorder.Pending(); got != 3 {
		t.Fatalf("%d records pending, want 3", got)
	}
	if err := recorder.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(counter.batches) != 1 {
		t.Fatalf("%d batches, want one per flush", len(counter.batches))
	}
	got := map[string]int64{}
	for _, c := range counter.batches[0] {
		if !c.CompletedAt.Equal(completedAt) || c.Since < 0 {
			t.Errorf("count %+v: want the replayed outcome's completion time %v and a last replay in the past", c, completedAt)
		}
		got[c.ID.Scope] += c.Count
	}
	if got["/pkg.S/Charge|tenant-1"] != 2 || got["/pkg.S/Charge|tenant-2"] != 1 || got["/pkg.S/Send"] != 1 {
		t.Fatalf("counts per record %v", got)
	}
	if err := recorder.Flush(ctx); err != nil || len(counter.batches) != 1 {
		t.Fatalf("a flush with nothing counted: %v, %d batches; want no statement", err, len(counter.batches))
	}
}

// The recorder holds at most MaxRecords records between flushes; a replay
// of one more is dropped and counted, and so are the counts of a flush that
// failed: counts are a lower bound, never more than what was served.
func TestReplayRecorderIsBoundedAndNeverCountsTwice(t *testing.T) {
	t.Parallel()
	counter := &countingStore{}
	m := dedupesvc.NewMetrics()
	recorder := dedupesvc.NewReplayRecorder(counter, dedupesvc.ReplayRecorderConfig{MaxRecords: 2, Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	at := time.Now()
	for _, key := range []string{"a", "b", "a", "c", "d"} {
		recorder.Record(dedupesvc.RecordID{Scope: "/s/M", Key: key}, at)
	}
	if recorder.Pending() != 2 {
		t.Fatalf("%d records pending, want the bound of 2", recorder.Pending())
	}
	if got := testutil.ToFloat64(m.ReplayCountsDropped()); got != 2 {
		t.Fatalf("%v replays dropped, want 2 (c and d)", got)
	}
	counter.err = errors.New("store down")
	if err := recorder.Flush(context.Background()); err == nil {
		t.Fatal("Flush hid the store's error")
	}
	if got := testutil.ToFloat64(m.ReplayCountsDropped()); got != 5 {
		t.Fatalf("%v replays dropped, want 5: a failed flush's 3 are not retried", got)
	}
	counter.err = nil
	if err := recorder.Flush(context.Background()); err != nil || len(counter.batches) != 1 {
		t.Fatalf("after a failed flush: %v, %d batches; want nothing sent again", err, len(counter.batches))
	}
}

// Run flushes on its own, every interval, with no call to Flush.
func TestReplayRecorderRunFlushes(t *testing.T) {
	t.Parallel()
	counter := &countingStore{}
	recorder := dedupesvc.NewReplayRecorder(counter, dedupesvc.ReplayRecorderConfig{Interval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); recorder.Run(ctx) }()
	recorder.Record(dedupesvc.RecordID{Scope: "/s/M", Key: "k"}, time.Now())
	for recorder.Pending() != 0 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if len(counter.batches) != 1 || counter.batches[0][0].Count != 1 {
		t.Fatalf("batches %+v, want the one count", counter.batches)
	}
}

// ForgetRecord refuses an in-flight record without force, naming its state,
// and logs who forgot what.
func TestForgetRecordIsRefusedInFlightAndLogged(t *testing.T) {
	t.Parallel()
	store, err := sqlitestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	var logs bytes.Buffer
	m := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(store, dedupesvc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), dedupesvc.WithMetrics(m))
	admin, err := dedupesvc.NewAdminServer(store, srv)
	if err != nil {
		t.Fatal(err)
	}
	ctx := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "payments"})
	if _, err := srv.Begin(ctx, validBegin()); err != nil {
		t.Fatal(err)
	}
	ref := &idemgatev1.RecordRef{Namespace: "payments", Scope: validBegin().GetScope(), Key: validBegin().GetKey()}
	opCtx := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "ops-alice", Admin: true})

	_, err = admin.ForgetRecord(opCtx, &idemgatev1.ForgetRecordRequest{Ref: ref})
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != dedupesvc.ReasonRecordNotSettled || !strings.Contains(err.Error(), "force") {
		t.Fatalf("forget in flight: %v, want FAILED_PRECONDITION %s naming force", err, dedupesvc.ReasonRecordNotSettled)
	}
	if strings.Contains(logs.String(), "forgotten") {
		t.Fatalf("a refused forget was logged as done:\n%s", logs.String())
	}
	resp, err := admin.ForgetRecord(opCtx, &idemgatev1.ForgetRecordRequest{Ref: ref, Force: true})
	if err != nil || resp.GetRecord().GetState() != dedupesvc.StateInFlight {
		t.Fatalf("forced forget: %v, %v; want the in-flight record as it was", resp, err)
	}
	for _, want := range []string{"record forgotten", "by=ops-alice", "namespace=payments", "key=order-1", "state=in_flight", "forced=true"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	if got := testutil.ToFloat64(m.ForgottenCounter(dedupesvc.StateInFlight, true)); got != 1 {
		t.Fatalf("forgotten counter %v, want 1", got)
	}
	if _, err := admin.ForgetRecord(opCtx, &idemgatev1.ForgetRecordRequest{Ref: &idemgatev1.RecordRef{Scope: "/pkg.S/M", Key: "absent"}}); status.Code(err) != codes.NotFound {
		t.Fatalf("forget of no record: %v, want NOT_FOUND", err)
	}
}

// Replays recorded while flushes run are each counted once: none lost,
// none twice (run it with -race).
func TestReplayRecorderCountsEachReplayOnceUnderConcurrentFlushes(t *testing.T) {
	t.Parallel()
	counter := &countingStore{}
	recorder := dedupesvc.NewReplayRecorder(counter, dedupesvc.ReplayRecorderConfig{Interval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); recorder.Run(ctx) }()
	const writers, each = 4, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				recorder.Record(dedupesvc.RecordID{Scope: "/s/M", Key: string(rune('a' + (w+i)%7))}, time.Unix(0, 0))
				if i%2 == 0 {
					// Pauses let flushes find nothing pending too, while
					// other replays arrive.
					time.Sleep(100 * time.Microsecond)
				}
			}
		})
	}
	wg.Wait()
	cancel()
	<-done
	if err := recorder.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, b := range counter.batches {
		for _, c := range b {
			total += c.Count
		}
	}
	if total != writers*each {
		t.Fatalf("%d replays counted over %d flushes, want %d", total, len(counter.batches), writers*each)
	}
}

// BenchmarkReplayRecorderRecord measures what a replay adds to Begin: one
// map update under a mutex.
func BenchmarkReplayRecorderRecord(b *testing.B) {
	recorder := dedupesvc.NewReplayRecorder(&countingStore{}, dedupesvc.ReplayRecorderConfig{})
	id, at := dedupesvc.RecordID{Namespace: "payments", Scope: "/pkg.S/M|tenant", Key: "order-1"}, time.Now()
	for b.Loop() {
		recorder.Record(id, at)
	}
}
