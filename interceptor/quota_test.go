package interceptor_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// TestQuotaExceededIsPreciseAndRetryable: a Begin the Dedupe service refuses
// for the caller's quota reaches the tool's caller as RESOURCE_EXHAUSTED
// IDEMPOTENCY_QUOTA_EXCEEDED naming the quota, with the service's RetryInfo,
// not as the store being down; the handler did not run.
func TestQuotaExceededIsPreciseAndRetryable(t *testing.T) {
	t.Parallel()
	h := setupWith(t, stacktest.Config{DedupeOptions: []dedupesvc.Option{dedupesvc.WithCallerRate(0.001, 1)}})
	req := &testingv1.MutateRequest{Payload: "charge"}
	if r := shortLease(withKey("quota-1"), h, req); r.err != nil {
		t.Fatalf("first call: %v", r.err)
	}
	r := shortLease(withKey("quota-2"), h, req)
	wantStatus(t, r.err, codes.ResourceExhausted, idemgate.ReasonQuotaExceeded)
	if d, ok := grpcerr.RetryDelay(r.err); !ok || d <= 0 {
		t.Fatalf("RetryInfo = %v, %v; want the Dedupe service's delay", d, ok)
	}
	for _, d := range status.Convert(r.err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()["quota"] != dedupesvc.QuotaRate {
			t.Fatalf("ErrorInfo metadata %v; want quota rate", info.GetMetadata())
		}
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("%d executions, want only the first call's", got)
	}
}

// TestFinishOverTheByteRateIsRetriedAndStored: a Finish the Dedupe service
// refuses for the caller's outcome byte rate (RESOURCE_EXHAUSTED with
// RetryInfo) is retried until the bucket refills and its outcome stored: a
// duplicate replays it, nothing is lost and nothing runs twice. A caller
// whose outcome is not stored within its lease is told to retry
// (IDEMPOTENCY_IN_FLIGHT) rather than answered with it.
func TestFinishOverTheByteRateIsRetriedAndStored(t *testing.T) {
	t.Parallel()
	// A bucket of 1,512 bytes (the largest outcome plus a type URL),
	// refilled at 60 a second. A Begin needs room for the largest outcome,
	// so the two calls begin together, while the bucket is full: the first
	// is held in its handler (3s, generous for a starved machine) while the
	// second runs and finishes, and the first's 900-byte outcome then finds
	// the bucket short and waits for it.
	h := setupWith(t, stacktest.Config{DedupeOptions: []dedupesvc.Option{
		dedupesvc.WithMaxOutcomeBytes(1000), dedupesvc.WithCallerOutcomeRate(60, 0),
	}})
	held := &testingv1.MutateRequest{Payload: strings.Repeat("x", 900), Delay: durationpb.New(3 * time.Second)}
	req := &testingv1.MutateRequest{Payload: strings.Repeat("y", 900)}
	firstDone := make(chan result, 1)
	go func() { firstDone <- shortLease(withKey("bytes-1"), h, held) }()
	<-h.svc.Started(held.GetPayload())
	second := shortLease(withKey("bytes-2"), h, req)
	first := <-firstDone
	if first.err != nil && grpcerr.Reason(first.err) != idemgate.ReasonInFlight || second.err != nil {
		t.Fatalf("calls: %v, %v; want the second answered, the first answered or told to retry", first.err, second.err)
	}
	if err := h.Gate.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The duplicates may find the bucket short too (a Begin needs room for
	// the largest outcome): they wait as its RetryInfo says, as a caller does.
	for _, c := range []struct {
		key   string
		req   *testingv1.MutateRequest
		first result
	}{{"bytes-1", held, first}, {"bytes-2", req, second}} {
		var again result
		for deadline := time.Now().Add(time.Minute); ; {
			again = shortLease(withKey(c.key), h, c.req)
			d, ok := grpcerr.RetryDelay(again.err)
			if status.Code(again.err) != codes.ResourceExhausted || !ok || time.Now().After(deadline) {
				break
			}
			time.Sleep(d)
		}
		if again.err != nil || !again.replayed || c.first.err == nil && !bytes.Equal(again.raw, c.first.raw) {
			t.Fatalf("the duplicate of %s: %v replayed=%v; want its stored outcome", c.key, again.err, again.replayed)
		}
	}
	if got := h.svc.Executions(); got != 2 {
		t.Fatalf("%d executions, want 2", got)
	}
	if stats := h.Gate.Stats(); stats.OutcomesLost != 0 || stats.FinishRetries == 0 {
		t.Fatalf("stats %+v; want a Finish retried for the byte rate and nothing lost", stats)
	}
}
