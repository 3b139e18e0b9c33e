package gobuild

import (
	"context"
	"errors"
	"testing"
	"time"
)

// While one builder holds the lock another waits for it, and gets it once
// it is released: two go builds at once on one cache compile each shared
// dependency twice (issue 32: 252 CPU-seconds for three tool servers built at
// once, 122 one after another).
func TestASecondBuilderWaitsForTheFirst(t *testing.T) {
	ctx := context.Background()
	unlock, err := Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		second, err := Lock(ctx)
		if err != nil {
			t.Error(err)
			second = func() {}
		}
		got <- second
	}()
	// Not a timing assertion: whatever the machine's speed, the second must
	// not hold the lock while the first does.
	time.Sleep(300 * time.Millisecond)
	select {
	case second := <-got:
		second()
		t.Fatal("a second builder got the lock while the first held it")
	default:
	}
	unlock()
	select {
	case second := <-got:
		second()
	case <-time.After(time.Minute):
		t.Fatal("the second builder did not get the lock a minute after the first released it")
	}
}

// A builder that gives up while it waits gets its context's error, not the
// lock.
func TestWaitingForTheLockHonoursTheContext(t *testing.T) {
	unlock, err := Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if second, err := Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			second()
		}
		t.Fatalf("Lock while held, context ending = %v, want context.DeadlineExceeded", err)
	}
}
