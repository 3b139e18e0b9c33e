package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// readCounter wraps a Store and counts its Begins, the store reads of a
// waiting duplicate.
type readCounter struct {
	dedupesvc.Store
	begins atomic.Int64
}

func (c *readCounter) Begin(ctx context.Context, p dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	c.begins.Add(1)
	return c.Store.Begin(ctx, p)
}

// Waiters is how many duplicates wait on one in-flight key in
// testServiceWaiters, as in issue 11.
const Waiters = 2000

// waiterBudget bounds how long one waiter of testServiceWaiters may take in
// all; the test wants an answer, not a latency.
const waiterBudget = 5 * time.Minute

// testServiceWaiters makes Waiters duplicates wait on one in-flight key and
// wants their store reads while they wait to be O(keys), not O(waiters);
// it measures (and only logs) a neighbour's Begin throughput with and
// without them, and how far past max_wait the waiters answered.
func testServiceWaiters(t *testing.T, newStore func(*testing.T) dedupesvc.Store, notifier func(*testing.T, dedupesvc.Store) dedupesvc.Notifier) {
	store := &readCounter{Store: newStore(t)}
	opts := []dedupesvc.Option{dedupesvc.WithMaxWaiters(2*Waiters, 2*Waiters), dedupesvc.WithCallerRate(0, 0)}
	if notifier != nil {
		if n := notifier(t, store.Store); n != nil {
			opts = append(opts, dedupesvc.WithNotifier(n))
		}
	}
	srv := dedupesvc.NewServer(store, opts...)
	const neighbourBegins = 200
	neighbour := func(round string) time.Duration {
		start := time.Now()
		for i := range neighbourBegins {
			begun, err := srv.Begin(as("neighbour"), beginReq("/pkg.S/M", fmt.Sprintf("%s-%d", round, i), "t"))
			if err != nil || begun.GetReserved() == nil {
				t.Errorf("neighbour Begin %d = %v, %v", i, begun, err)
				return time.Since(start)
			}
		}
		return time.Since(start)
	}
	alone := neighbour("alone")

	holder, err := srv.Begin(as("busy"), beginReq("/pkg.S/M", "hot", "t-holder"))
	if err != nil || holder.GetReserved() == nil {
		t.Fatalf("holder Begin = %v, %v", holder, err)
	}
	// Long enough that the reads are counted while every waiter still waits,
	// also on a starved machine: at max_wait each waiter reads for itself.
	const maxWait = 10 * time.Second
	var (
		wg       sync.WaitGroup
		overrun  atomic.Int64 // the largest, in nanoseconds
		answers  sync.Map     // kind -> *atomic.Int64
		waiting  sync.WaitGroup
		firstErr atomic.Value
	)
	count := func(kind string) {
		v, _ := answers.LoadOrStore(kind, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	waiting.Add(Waiters)
	waitersStarted := time.Now()
	beforeWaiters := store.begins.Load()
	for i := range Waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := beginReq("/pkg.S/M", "hot", fmt.Sprintf("t-%d", i))
			req.MaxWait = durationpb.New(maxWait)
			// Generous: the 2,000 first Begins and the 2,000 reads at max_wait
			// queue on the store's few connections, about 4,000 store calls;
			// on Citus under load (some 25 ms a call) that took past a minute.
			c, cancel := context.WithTimeout(as("busy"), waiterBudget)
			defer cancel()
			start := time.Now()
			waiting.Done()
			resp, err := srv.Begin(c, req)
			if over := time.Since(start) - maxWait; over > time.Duration(overrun.Load()) {
				overrun.Store(int64(over))
			}
			switch {
			case err != nil:
				firstErr.CompareAndSwap(nil, err)
				count("error")
			case resp.GetInFlight() != nil:
				count("in_flight")
			case resp.GetCompleted() != nil:
				count("completed")
			default:
				count("other")
			}
		}()
	}
	waiting.Wait()
	// Each waiter's first Begin is its own; the waits follow.
	withWaiters := neighbour("crowded")
	time.Sleep(500 * time.Millisecond) // a few poll intervals with the neighbour gone
	readsWhileWaiting := store.begins.Load() - beforeWaiters - Waiters - neighbourBegins
	countedInTime := time.Since(waitersStarted) < maxWait-time.Second
	wg.Wait()

	var summary []string
	answers.Range(func(k, v any) bool {
		summary = append(summary, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	t.Logf("%d waiters on one key for max_wait %s: answers %v; store reads while they waited %d (excluding their first Begins); max_wait overrun at most %s",
		Waiters, maxWait, summary, readsWhileWaiting, time.Duration(overrun.Load()))
	t.Logf("neighbour: %d Begins in %s alone, %s beside the waiters: throughput ratio (with/without) %.2f",
		neighbourBegins, alone.Round(time.Millisecond), withWaiters.Round(time.Millisecond), alone.Seconds()/withWaiters.Seconds())
	if err, _ := firstErr.Load().(error); err != nil {
		t.Fatalf("a waiter failed: %v", err)
	}
	// O(keys): a handful of shared re-reads for the one key, not one per
	// waiter per poll (2,000 waiters polling every 200ms made ~10,000 a
	// second). The bound is loose; the figure is logged above.
	if !countedInTime {
		t.Logf("the machine was too slow to count the reads before max_wait ran out; the bound is not checked this run")
	} else if readsWhileWaiting > Waiters/10 {
		t.Fatalf("%d store reads while %d waited on one key; want O(keys), not O(waiters)", readsWhileWaiting, Waiters)
	}

	// When the outcome is stored, every waiter gets it from one shared read.
	before := store.begins.Load()
	var done sync.WaitGroup
	results := make(chan *idemgatev1.BeginResponse, Waiters)
	for i := range Waiters {
		done.Add(1)
		go func() {
			defer done.Done()
			req := beginReq("/pkg.S/M", "hot", fmt.Sprintf("t2-%d", i))
			req.MaxWait = durationpb.New(time.Minute)
			resp, err := srv.Begin(as("busy"), req)
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
			results <- resp
		}()
	}
	// Let them register before the outcome is stored (a bounded wait).
	for deadline := time.Now().Add(30 * time.Second); store.begins.Load()-before < Waiters && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := srv.Finish(as("busy"), &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "hot", AttemptToken: "t-holder", Epoch: holder.GetReserved().GetEpoch(),
		Outcome: &anypb.Any{TypeUrl: outA.TypeURL, Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	done.Wait()
	close(results)
	for resp := range results {
		if resp.GetCompleted() == nil {
			t.Fatalf("a waiter got %v after the outcome was stored, want it replayed", resp)
		}
	}
	t.Logf("after Finish, %d waiters answered with %d store reads in all (their first Begins included)", Waiters, store.begins.Load()-before)
}
