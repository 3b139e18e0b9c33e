package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// cutOffFirstAttempt fails every Finish and Heartbeat of the first attempt
// at key, before they reach the service: the store is away for that holder
// only, so its caller is answered while its outcome is never stored and its
// lease runs out, and later attempts are served normally.
func cutOffFirstAttempt(key string) grpc.UnaryClientInterceptor {
	var mu sync.Mutex
	first := ""
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		mu.Lock()
		var token string
		switch r := req.(type) {
		case *idemgatev1.BeginRequest:
			if r.GetKey() == key && first == "" {
				first = r.GetAttemptToken()
			}
		case *idemgatev1.FinishRequest:
			token = r.GetAttemptToken()
		case *idemgatev1.HeartbeatRequest:
			token = r.GetAttemptToken()
		}
		cut := token != "" && token == first
		mu.Unlock()
		if cut {
			return status.Errorf(codes.Unavailable, "test: %s cannot get through", method)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// Under the default FINISH_POLICY_BEFORE_REPLY a caller is answered only
// with an outcome the store took (issue 31): when its Finish keeps failing
// it is retried before the answer for up to a lease, then the caller gets
// IDEMPOTENCY_IN_FLIGHT (retryable) instead of a response nobody stored.
// Once the lease is lost, under FAIL_CLOSED a retry gets
// IDEMPOTENCY_OUTCOME_UNKNOWN and nothing runs again; under REEXECUTE a
// retry takes the key over and runs it, and no caller holds an answer for
// the first run.
func TestAnAnsweredCallWhoseOutcomeWasNeverStored(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		method func(testingv1.TestServiceClient) func(context.Context, *testingv1.MutateRequest, ...grpc.CallOption) (*testingv1.MutateResponse, error)
		rerun  bool
	}{
		"fail closed": {method: func(c testingv1.TestServiceClient) func(context.Context, *testingv1.MutateRequest, ...grpc.CallOption) (*testingv1.MutateResponse, error) {
			return c.MutateShortLease
		}},
		"reexecute": {method: func(c testingv1.TestServiceClient) func(context.Context, *testingv1.MutateRequest, ...grpc.CallOption) (*testingv1.MutateResponse, error) {
			return c.MutateReexecute
		}, rerun: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const key = "answered-never-stored"
			// The Finish is still being retried when the lease runs out.
			h := setupWith(t, stacktest.Config{
				DedupeClientInterceptor: cutOffFirstAttempt(key),
				GateOptions:             []interceptor.Option{interceptor.WithFinishRetryBudget(10 * time.Second)},
			})
			call := tc.method(h.client)
			req := &testingv1.MutateRequest{Payload: "charge"}
			first, err := call(withKey(key), req)
			wantStatus(t, err, codes.Aborted, idemgate.ReasonInFlight)
			time.Sleep(pastLease)
			var header metadata.MD
			var again *testingv1.MutateResponse
			r := retryUntilSettled(t, func() result {
				header = nil
				again, err = call(withKey(key), req, grpc.Header(&header))
				return result{err: err}
			})
			if !tc.rerun {
				wantStatus(t, r.err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
				if n := h.svc.Executions(); n != 1 {
					t.Fatalf("%d executions, want 1: FAIL_CLOSED never runs an answered call again", n)
				}
				return
			}
			if r.err != nil || len(header.Get(idemgate.ReplayedHeader)) != 0 {
				t.Fatalf("retry: %v (header %v), want a fresh run", r.err, header)
			}
			if n := h.svc.Executions(); n != 2 || again.GetEpoch() <= first.GetEpoch() {
				t.Fatalf("%d executions, epochs %d then %d; want the answered call run again by a takeover (a higher epoch: epochs come from one store-wide counter, so they may skip)", n, first.GetEpoch(), again.GetEpoch())
			}
		})
	}
}
