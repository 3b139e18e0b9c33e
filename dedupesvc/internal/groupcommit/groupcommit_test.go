package groupcommit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// recorder is a flush that records each batch and can be held, so requests
// queue behind a commit in progress.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	hold    chan struct{} // nil: never held
	entered chan struct{}
}

type job struct {
	n      int
	result int
}

func (r *recorder) flush(ctx context.Context, batch []*job) {
	if r.hold != nil {
		r.entered <- struct{}{}
		select {
		case <-r.hold:
		case <-ctx.Done():
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var ns []int
	for _, j := range batch {
		ns = append(ns, j.n)
		j.result = j.n * 10
	}
	r.batches = append(r.batches, ns)
}

// queued waits until g holds n queued requests (a bounded wait, no timing
// assertion).
func queued[T any](t *testing.T, g *Group[T], n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		g.mu.Lock()
		got := len(g.queue)
		g.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued after 30s, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestIdleRequestIsWrittenAloneAtOnce(t *testing.T) {
	r := &recorder{}
	g := New(Config{MaxBatch: 8, MaxDelay: time.Hour}, r.flush)
	for i := range 3 {
		j := &job{n: i}
		if err := g.Do(context.Background(), j); err != nil || j.result != i*10 {
			t.Fatalf("Do = %v, result %d", err, j.result)
		}
	}
	// An hour's MaxDelay would have stalled the test had an idle request
	// waited for a batch.
	if commits, ops := g.Stats(); commits != 3 || ops != 3 {
		t.Fatalf("Stats = %d commits, %d ops; want each request its own commit", commits, ops)
	}
}

func TestRequestsQueuedBehindACommitShareTheNext(t *testing.T) {
	r := &recorder{hold: make(chan struct{}), entered: make(chan struct{}, 16)}
	g := New(Config{MaxBatch: 4}, r.flush)
	var wg sync.WaitGroup
	do := func(n int) {
		wg.Go(func() {
			j := &job{n: n}
			if err := g.Do(context.Background(), j); err != nil || j.result != n*10 {
				t.Errorf("Do(%d) = %v, result %d", n, err, j.result)
			}
		})
	}
	do(0)
	<-r.entered // the first is being written, alone
	for i := 1; i <= 6; i++ {
		do(i)
	}
	queued(t, g, 6)
	close(r.hold)
	wg.Wait()
	if len(r.batches) != 3 || len(r.batches[0]) != 1 || len(r.batches[1]) != 4 || len(r.batches[2]) != 2 {
		t.Fatalf("batches %v; want [0], then the six queued in batches of at most 4", r.batches)
	}
}

func TestCanceledCallerDoesNotBreakOthers(t *testing.T) {
	r := &recorder{hold: make(chan struct{}), entered: make(chan struct{}, 16)}
	g := New(Config{MaxBatch: 8}, r.flush)
	first := &job{n: 0}
	firstDone := make(chan error)
	go func() { firstDone <- g.Do(context.Background(), first) }()
	<-r.entered

	gone, cancel := context.WithCancel(context.Background())
	goneDone := make(chan error)
	go func() { goneDone <- g.Do(gone, &job{n: 1}) }()
	stays := &job{n: 2}
	staysDone := make(chan error)
	go func() { staysDone <- g.Do(context.Background(), stays) }()
	queued(t, g, 2)
	cancel()
	if err := <-goneDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Do = %v, want context.Canceled", err)
	}
	close(r.hold)
	if err := <-firstDone; err != nil || first.result != 0 {
		t.Fatalf("first Do = %v", err)
	}
	if err := <-staysDone; err != nil || stays.result != 20 {
		t.Fatalf("Do beside a canceled caller = %v, result %d", err, stays.result)
	}
	if len(r.batches) != 2 || len(r.batches[1]) != 1 || r.batches[1][0] != 2 {
		t.Fatalf("batches %v; want the canceled request left out", r.batches)
	}
}

func TestFlushContextEndsWhenEveryCallerGaveUp(t *testing.T) {
	entered, ended := make(chan struct{}), make(chan struct{})
	g := New(Config{MaxBatch: 8}, func(ctx context.Context, _ []*job) {
		close(entered)
		<-ctx.Done()
		close(ended)
	})
	c, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Do(c, &job{}) }()
	<-entered
	cancel()
	<-ended // hangs (and the test times out) if the write outlives its callers
	// Written on the caller's goroutine, Do returns once the write ended (nil:
	// the op holds the write's outcome), else with the cancellation.
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v", err)
	}
}

func TestQueuedBatchLingersForMaxDelayThenIsWritten(t *testing.T) {
	r := &recorder{hold: make(chan struct{}), entered: make(chan struct{}, 16)}
	g := New(Config{MaxBatch: 8, MaxDelay: 50 * time.Millisecond}, r.flush)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			if err := g.Do(context.Background(), &job{n: i}); err != nil {
				t.Error(err)
			}
		})
		if i == 0 {
			<-r.entered
		}
	}
	queued(t, g, 2)
	close(r.hold)
	wg.Wait()
	if len(r.batches) != 2 || len(r.batches[1]) != 2 {
		t.Fatalf("batches %v; want the first alone, then the two queued together", r.batches)
	}
}
