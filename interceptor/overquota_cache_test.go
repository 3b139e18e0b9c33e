package interceptor_test

import (
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testlog"
)

// An outcome the Dedupe service replaced by the ResultTooLarge marker (it
// would have taken the caller over its stored-bytes quota) is not kept in
// the gate's replay cache: a duplicate on this tool server gets what the
// store keeps, IDEMPOTENCY_RESULT_TOO_LARGE, as one on any other does, not
// the response the store never took.
func TestAnOutcomeTheServiceReplacedIsNotCached(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	h := setupWith(t, stacktest.Config{
		GateOptions: []interceptor.Option{interceptor.WithReplayCache(100, 1<<20),
			interceptor.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))},
		DedupeOptions: []dedupesvc.Option{dedupesvc.WithCallerQuota(0, 500)},
	})
	req := &testingv1.MutateRequest{Payload: strings.Repeat("x", 2000)}
	if r := shortLease(withKey("over-quota"), h, req); r.err != nil {
		t.Fatalf("the holder's call: %v, want its response", r.err)
	}
	// The gate's log says the service replaced it for the quota.
	if text := logs.String(); !strings.Contains(text, "stored-outcome quota (-caller-max-bytes)") {
		t.Errorf("the gate logged %q; want the replacement logged, naming the stored-outcome quota", text)
	}
	r := shortLease(withKey("over-quota"), h, req)
	wantStatus(t, r.err, codes.FailedPrecondition, idemgate.ReasonResultTooLarge)
	// The duplicate is told why: the quota, not the size limit.
	if msg := status.Convert(r.err).Message(); !strings.Contains(msg, "stored-outcome quota") || strings.Contains(msg, "over the size limit") {
		t.Errorf("the duplicate's message %q; want it to name the stored-outcome quota, not the size limit", msg)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("%d executions, want 1", got)
	}
}
