package dedupesvc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// TestDeclaredFinishIsChargedOnce: a Finish whose size was declared and
// taken as it arrived (AdmitFinishCall) is not charged again by Finish, so
// an outcome that fills the bucket is stored; a second declared Finish is
// refused as it arrives (quota rate, RetryInfo); and an outcome larger than
// its declaration is refused INVALID_ARGUMENT.
func TestDeclaredFinishIsChargedOnce(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	// The burst is raised to the largest outcome plus its type URL.
	srv := dedupesvc.NewServer(store, dedupesvc.WithCallerOutcomeRate(0.001, 1), dedupesvc.WithMaxOutcomeBytes(1000))
	req := validFinish(1000) // 1,026 bytes with its type URL, of a bucket of 1,512
	size := len(req.GetOutcome().GetTypeUrl()) + len(req.GetOutcome().GetValue())
	greedy := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "greedy"})
	ctx, cancel := context.WithCancel(greedy)
	defer cancel()
	ctx, err := srv.AdmitFinishCall(ctx, "greedy", size)
	if err != nil {
		t.Fatalf("a declared Finish with the bucket full: %v", err)
	}
	if _, err := srv.Finish(ctx, req); err != nil {
		t.Fatalf("the Finish its declaration paid for: %v (charged twice?)", err)
	}
	_, err = srv.AdmitFinishCall(greedy, "greedy", 1000)
	if status.Code(err) != codes.ResourceExhausted || grpcerr.Reason(err) != dedupesvc.ReasonQuotaExceeded {
		t.Fatalf("a declared Finish with the bucket empty = %v, want RESOURCE_EXHAUSTED %s", err, dedupesvc.ReasonQuotaExceeded)
	}
	if d, ok := grpcerr.RetryDelay(err); !ok || d <= 0 {
		t.Fatalf("RetryInfo %v, %v; want a delay", d, ok)
	}
	liar, cancelLiar := context.WithCancel(dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "liar"}))
	defer cancelLiar()
	liar, err = srv.AdmitFinishCall(liar, "liar", 10)
	if err != nil {
		t.Fatal(err)
	}
	calls := store.calls
	if _, err := srv.Finish(liar, validFinish(100)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an outcome over its declared size = %v, want INVALID_ARGUMENT", err)
	}
	if store.calls != calls {
		t.Fatal("an outcome over its declared size reached the store")
	}
}

// TestFinishBytesInFlightAreGivenBack: a caller's Finishes in flight
// (WithMaxFinishBytesInFlight) are refused past the limit
// (finish_bytes_in_flight) and admitted again once one ends; other callers
// are not affected.
func TestFinishBytesInFlightAreGivenBack(t *testing.T) {
	t.Parallel()
	srv := dedupesvc.NewServer(&fakeStore{}, dedupesvc.WithMaxOutcomeBytes(1000), dedupesvc.WithMaxFinishBytesInFlight(2*(1000+dedupesvc.MaxTypeURLBytes)))
	var cancels []context.CancelFunc
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		if _, err := srv.AdmitFinishCall(ctx, "greedy", -1); err != nil { // undeclared: the largest outcome
			t.Fatal(err)
		}
	}
	_, err := srv.AdmitFinishCall(context.Background(), "greedy", -1)
	if status.Code(err) != codes.ResourceExhausted || errorInfo(t, err).GetMetadata()["quota"] != dedupesvc.QuotaFinishesInFlight {
		t.Fatalf("a third undeclared Finish in flight = %v, want RESOURCE_EXHAUSTED quota %s", err, dedupesvc.QuotaFinishesInFlight)
	}
	if _, err := srv.AdmitFinishCall(context.Background(), "neighbour", -1); err != nil {
		t.Fatalf("another caller: %v", err)
	}
	cancels[0]()
	// context.AfterFunc gives the bytes back on its own goroutine.
	for {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := srv.AdmitFinishCall(ctx, "greedy", -1)
		cancel()
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	cancels[1]()
}
