package interceptor_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
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
	wantStatus(t, r.err, codes.ResourceExhausted, interceptor.ReasonQuotaExceeded)
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
// duplicate replays it, nothing is lost and nothing runs twice.
func TestFinishOverTheByteRateIsRetriedAndStored(t *testing.T) {
	t.Parallel()
	// A bucket of 1,512 bytes (the largest outcome plus a type URL),
	// refilled at 2,000 a second: the second 900-byte outcome waits for it.
	h := setupWith(t, stacktest.Config{DedupeOptions: []dedupesvc.Option{
		dedupesvc.WithMaxOutcomeBytes(1000), dedupesvc.WithCallerOutcomeRate(2000, 0),
	}})
	req := &testingv1.MutateRequest{Payload: strings.Repeat("x", 900)}
	first := shortLease(withKey("bytes-1"), h, req)
	second := shortLease(withKey("bytes-2"), h, req)
	if first.err != nil || second.err != nil {
		t.Fatalf("calls: %v, %v", first.err, second.err)
	}
	if err := h.Gate.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	again := shortLease(withKey("bytes-2"), h, req)
	if again.err != nil || !again.replayed || !bytes.Equal(again.raw, second.raw) {
		t.Fatalf("the duplicate of the call whose Finish was rate limited: %v replayed=%v; want its stored outcome", again.err, again.replayed)
	}
	if got := h.svc.Executions(); got != 2 {
		t.Fatalf("%d executions, want 2", got)
	}
	if stats := h.Gate.Stats(); stats.OutcomesLost != 0 {
		t.Fatalf("stats %+v; want nothing lost", stats)
	}
}
