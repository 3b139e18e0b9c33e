package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The edges of exactly-once (issue 9): each test pins one way the promise
// broke before, against a real Dedupe service on real PostgreSQL.

// retryUntilSettled calls until the answer is not IDEMPOTENCY_IN_FLIGHT, as a
// caller honouring RetryInfo would, and returns the first settled result.
func retryUntilSettled(t *testing.T, call func() result) result {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := call()
		if status.Code(r.err) != codes.Aborted || time.Now().After(deadline) {
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestCallerThatGivesUpDoesNotRunTwice(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const keys = 8
	calls := map[string]func(ctx context.Context, req *testingv1.MutateRequest) result{
		"fail closed": h.mutate,
		"reexecute": func(ctx context.Context, req *testingv1.MutateRequest) result {
			var header grpcHeader
			resp, err := h.client.MutateReexecute(ctx, req, grpc.Header(&header.MD))
			return result{resp: resp, err: err, replayed: len(header.Get(idemgate.ReplayedHeader)) == 1}
		},
	}
	var wg sync.WaitGroup
	for name, call := range calls {
		for i := range keys {
			wg.Go(func() {
				key := fmt.Sprintf("gave-up-%s-%d", strings.ReplaceAll(name, " ", "-"), i)
				// The handler's provider call takes 10s and honours its
				// context; the caller gives up once the handler has started
				// (not after a fixed time, which a starved machine can spend
				// before Begin is even answered).
				req := &testingv1.MutateRequest{Payload: key, Delay: durationpb.New(10 * time.Second)}
				ctx, cancel := context.WithCancel(withKey(key))
				go func() {
					select {
					case <-h.svc.Started(key):
					case <-ctx.Done():
					case <-time.After(2 * time.Minute):
					}
					cancel()
				}()
				first := call(ctx, req)
				cancel()
				if status.Code(first.err) != codes.Canceled {
					t.Errorf("%s: first call: %v, want the caller's own CANCELLED", key, first.err)
				}
				retry := retryUntilSettled(t, func() result { return call(withKey(key), req) })
				if retry.err != nil || !retry.replayed || retry.resp.GetPayload() != key {
					t.Errorf("%s: retry: %v %v replayed=%v, want the first execution's outcome replayed", key, retry.resp, retry.err, retry.replayed)
				}
			})
		}
	}
	wg.Wait()
	if got := h.svc.Executions(); got != 2*keys {
		t.Fatalf("%d executions for %d keys whose callers gave up: a cancellation turned into a second run", got, 2*keys)
	}
}

func TestExecutionTimeoutLeavesTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{Payload: "slow provider", Delay: durationpb.New(30 * time.Second)}
	_, err := h.client.MutateBounded(withKey("bounded"), req)
	wantStatus(t, err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
	if cause := h.svc.LastCause(); !errors.Is(cause, idemgate.ErrExecutionTimeout) {
		t.Errorf("handler context ended with %v, want ErrExecutionTimeout", cause)
	}
	// The handler cannot tell whether the provider acted: the key is not
	// freed, every retry is told so, and nothing runs again.
	_, err = h.client.MutateBounded(withKey("bounded"), req)
	wantStatus(t, err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("%d executions, want 1", got)
	}
}

func TestUnknownOutcomeUnderReexecuteFreesTheKey(t *testing.T) {
	t.Parallel()
	h := setup(t)
	// A DEADLINE_EXCEEDED from the handler's own downstream call: REEXECUTE
	// declares a re-run safe, so the key is freed at once.
	req := &testingv1.MutateRequest{Payload: "p", FailCode: int32(codes.DeadlineExceeded)}
	_, err := h.client.MutateReexecute(withKey("reexec-unknown"), req)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want the handler's DEADLINE_EXCEEDED", err)
	}
	_, err = h.client.MutateReexecute(withKey("reexec-unknown"), req)
	if status.Code(err) != codes.DeadlineExceeded || h.svc.Executions() != 2 {
		t.Fatalf("retry: %v after %d executions, want it run again", err, h.svc.Executions())
	}
}

// delayFinish holds every Finish for d before sending it, as a slow network
// or a busy Dedupe service would.
func delayFinish(d time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == idemgatev1.DedupeService_Finish_FullMethodName {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func TestLeaseRenewedWhileFinishIsSlow(t *testing.T) {
	t.Parallel()
	h := setupWith(t, stacktest.Config{
		DedupeClientInterceptor: delayFinish(3 * time.Second),
		GateOptions:             []interceptor.Option{interceptor.WithOutcomeTimeout(10 * time.Second)},
	})
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, in *testingv1.MutateRequest, opts ...grpc.CallOption) (*testingv1.MutateResponse, error)
	}{
		{"reexecute", h.client.MutateReexecute},
		{"fail closed", h.client.MutateShortLease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "slow-finish-" + strings.ReplaceAll(tc.name, " ", "-")
			req := &testingv1.MutateRequest{Payload: key}
			firstDone := make(chan error, 1)
			go func() {
				_, err := tc.call(withKey(key), req)
				firstDone <- err
			}()
			// Past the 1s lease, while the first call's Finish is held up.
			time.Sleep(2 * time.Second)
			_, err := tc.call(withKey(key), req)
			wantStatus(t, err, codes.Aborted, idemgate.ReasonInFlight)
			if err := <-firstDone; err != nil {
				t.Fatalf("first call: %v", err)
			}
		})
	}
	if got := h.svc.Executions(); got != 2 {
		t.Fatalf("%d executions for 2 keys: a live holder lost its lease while its Finish was on the way", got)
	}
}

// hangHeartbeats makes the first n heartbeats hang until their deadline, as
// a half-open connection does.
func hangHeartbeats(n int64) grpc.UnaryClientInterceptor {
	var seen atomic.Int64
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == idemgatev1.DedupeService_Heartbeat_FullMethodName && seen.Add(1) <= n {
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func TestHungHeartbeatsDoNotCostTheLease(t *testing.T) {
	t.Parallel()
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: hangHeartbeats(3)})
	req := &testingv1.MutateRequest{Payload: "slow", Delay: durationpb.New(3 * time.Second)}
	firstDone := make(chan error, 1)
	go func() {
		_, err := h.client.MutateReexecute(withKey("hung-hb"), req)
		firstDone <- err
	}()
	// Past the 1s lease, in the gap three hung renewals in a row would
	// leave if each waited for the one before it.
	time.Sleep(1300 * time.Millisecond)
	_, err := h.client.MutateReexecute(withKey("hung-hb"), req)
	wantStatus(t, err, codes.Aborted, idemgate.ReasonInFlight)
	if err := <-firstDone; err != nil {
		t.Fatalf("first call: %v", err)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("%d executions: hung renewals cost a live holder its lease", got)
	}
}

// loseBeginReply lets the first Begin of key reach the service and then
// loses its answer, as a crash or a cut connection after the commit does.
func loseBeginReply(key string) grpc.UnaryClientInterceptor {
	var lost atomic.Bool
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if begin, ok := req.(*idemgatev1.BeginRequest); ok && begin.GetKey() == key && err == nil && lost.CompareAndSwap(false, true) {
			return status.Error(codes.Unavailable, "test: the answer to Begin was lost")
		}
		return err
	}
}

func TestLostBeginReplyDoesNotStrandTheKey(t *testing.T) {
	t.Parallel()
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: loseBeginReply("lost-begin")})
	req := &testingv1.MutateRequest{Payload: "charge"}
	r := shortLease(withKey("lost-begin"), h, req)
	wantStatus(t, r.err, codes.Unavailable, idemgate.ReasonStoreUnavailable)
	if h.svc.Executions() != 0 {
		t.Fatal("the handler ran although Begin's answer was lost")
	}
	if got := h.Gate.Stats().LostBegins; got != 1 {
		t.Errorf("LostBegins = %d, want 1", got)
	}
	// Past the lease: a FAIL_CLOSED key whose handler never ran must not
	// be outcome-unknown. The retry runs it, once.
	time.Sleep(pastLease)
	r = retryUntilSettled(t, func() result { return shortLease(withKey("lost-begin"), h, req) })
	if r.err != nil || r.replayed || h.svc.Executions() != 1 {
		t.Fatalf("retry: %v replayed=%v after %d executions, want it to run once", r.err, r.replayed, h.svc.Executions())
	}
}

func TestOutcomeOverTheServiceLimitStoresTheMarker(t *testing.T) {
	t.Parallel()
	// The service's limit (1 KiB) is below the Gate's default (1 MiB).
	h := setupWith(t, stacktest.Config{DedupeOptions: []dedupesvc.Option{dedupesvc.WithMaxOutcomeBytes(1024)}})
	req := &testingv1.MutateRequest{Payload: strings.Repeat("x", 4096)}
	if _, err := h.client.MutateReexecute(withKey("too-big"), req); err != nil {
		t.Fatalf("first call: %v, want its response", err)
	}
	time.Sleep(pastLease)
	_, err := h.client.MutateReexecute(withKey("too-big"), req)
	wantStatus(t, err, codes.FailedPrecondition, idemgate.ReasonResultTooLarge)
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("%d executions: an outcome the service refused as too large was re-run", got)
	}
	if got := h.Gate.Stats().TooLarge; got != 1 {
		t.Errorf("TooLarge = %d, want 1", got)
	}
}

func TestFencedHandlerIsTold(t *testing.T) {
	t.Parallel()
	var blockHeartbeats atomic.Bool
	blockHeartbeats.Store(true)
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: failWhile(idemgatev1.DedupeService_Heartbeat_FullMethodName, blockHeartbeats.Load)})
	holder := &testingv1.MutateRequest{Payload: "slow", Delay: durationpb.New(8 * time.Second)}
	holderDone := make(chan error, 1)
	go func() {
		_, err := h.client.MutateReexecute(withKey("fenced"), holder)
		holderDone <- err
	}()
	// The holder cannot renew; past its lease a REEXECUTE caller takes over.
	time.Sleep(2 * time.Second)
	type answer struct {
		resp *testingv1.MutateResponse
		err  error
	}
	takeover := make(chan answer, 1)
	go func() {
		resp, err := h.client.MutateReexecute(withKey("fenced"), holder)
		takeover <- answer{resp, err}
	}()
	// Once the takeover runs, let the holder's renewals through: the next
	// one is refused, and the holder's handler must hear of it at once.
	for deadline := time.Now().Add(30 * time.Second); h.svc.Executions() < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no takeover after the holder's lease ran out")
		}
	}
	blockHeartbeats.Store(false)
	select {
	case <-holderDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the fenced holder's handler was not cancelled")
	}
	if cause := h.svc.LastCause(); !errors.Is(cause, idemgate.ErrFenced) {
		t.Fatalf("the holder's context ended with %v, want ErrFenced", cause)
	}
	if got := h.Gate.Stats().Fenced; got < 1 {
		t.Errorf("Fenced = %d, want the refused renewal counted", got)
	}
	a := <-takeover
	// Epochs are unique across the store, not consecutive: above the
	// fenced holder's first one is what fencing needs.
	if a.err != nil || a.resp.GetEpoch() <= 1 {
		t.Fatalf("takeover: %v %v, want an epoch above the fenced holder's 1", a.resp, a.err)
	}
}

func TestDownstreamKeyIsStablePerActionAndUniqueAcrossActions(t *testing.T) {
	t.Parallel()
	h := setup(t)
	a, err := h.client.Mutate(withKey("same-key"), &testingv1.MutateRequest{Payload: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.client.MutateOther(withKey("same-key"), &testingv1.MutateRequest{Payload: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if a.GetKey() != "same-key" || b.GetKey() != "same-key" {
		t.Fatalf("KeyFromContext: %q and %q, want the caller's key", a.GetKey(), b.GetKey())
	}
	if !strings.HasPrefix(a.GetDownstreamKey(), "idg_") || a.GetDownstreamKey() == b.GetDownstreamKey() {
		t.Fatalf("downstream keys %q and %q: want two different idg_ keys for two methods", a.GetDownstreamKey(), b.GetDownstreamKey())
	}
	if a.GetEpoch() != 1 {
		t.Fatalf("epoch %d, want 1 for a first reservation", a.GetEpoch())
	}
}

func TestRenamedMethodKeepsItsAction(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{Payload: "charge"}
	first := h.mutate(withKey("renamed"), req)
	if first.err != nil {
		t.Fatal(first.err)
	}
	var header grpcHeader
	again, err := h.client.MutateRenamed(withKey("renamed"), req, grpc.Header(&header.MD))
	if err != nil || again.GetExecution() != first.resp.GetExecution() || len(header.Get(idemgate.ReplayedHeader)) != 1 {
		t.Fatalf("renamed method: %v %v, want the record of the old name replayed", again, err)
	}
	if h.svc.Executions() != 1 {
		t.Fatalf("%d executions, want 1", h.svc.Executions())
	}
	if got := h.Gate.Policy(testingv1.TestService_MutateRenamed_FullMethodName).Action; got != testingv1.TestService_Mutate_FullMethodName {
		t.Fatalf("action %q", got)
	}
}

func TestReplayedFinalErrorCountsAsReplayed(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	h := setup(t, interceptor.WithRegisterer(reg))
	req := &testingv1.MutateRequest{FailCode: int32(codes.InvalidArgument), FailDetail: "CARD_DECLINED"}
	for range 3 {
		if _, err := h.client.MutateReplayErrors(withKey("declined"), req); status.Code(err) != codes.InvalidArgument {
			t.Fatal(err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "idemgate_interceptor_calls_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if got["executed"] != 1 || got["replayed"] != 2 || len(got) != 2 {
		t.Fatalf("calls by outcome %v, want executed 1 and replayed 2 (a tool's own reason is no label)", got)
	}
}

func TestCloseStopsBackgroundRetries(t *testing.T) {
	t.Parallel()
	h := setupWith(t, stacktest.Config{
		DedupeClientInterceptor: failWhile(idemgatev1.DedupeService_Finish_FullMethodName, func() bool { return true }),
		GateOptions:             []interceptor.Option{interceptor.WithFinishRetryBudget(time.Hour)},
	})
	// Never stored: the caller is told to retry once a lease of retries
	// before its answer has passed; the rest go on in the background.
	if r := h.mutate(withKey("close"), &testingv1.MutateRequest{}); grpcerr.Reason(r.err) != idemgate.ReasonInFlight {
		t.Fatalf("%v, want IDEMPOTENCY_IN_FLIGHT", r.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- h.Gate.Close(ctx) }()
	select {
	case err := <-closed:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close: %v, want its context's error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not stop a background retry that was sleeping")
	}
	if got := h.Gate.Stats().OutcomesLost; got != 1 {
		t.Errorf("OutcomesLost = %d, want the stopped Finish counted", got)
	}
}

func TestStaleFinishAfterResolveIsFenced(t *testing.T) {
	t.Parallel()
	var blockHeartbeats atomic.Bool
	blockHeartbeats.Store(true)
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: failWhile(idemgatev1.DedupeService_Heartbeat_FullMethodName, blockHeartbeats.Load)})
	req := &testingv1.MutateRequest{Payload: "slow", Delay: durationpb.New(3 * time.Second)}
	done := make(chan result, 1)
	go func() { done <- shortLease(withKey("resolved-under"), h, req) }()
	time.Sleep(pastLease + 200*time.Millisecond)
	// The holder looks dead; an operator settles the record from the
	// provider's books while the handler, in fact, still runs.
	resolved, _ := anypb.New(&testingv1.MutateResponse{Payload: "as the provider recorded it"})
	if _, err := h.Dedupe.Resolve(context.Background(), &idemgatev1.ResolveRequest{
		Scope: testingv1.TestService_MutateShortLease_FullMethodName, Key: "resolved-under",
		Resolution: &idemgatev1.ResolveRequest_Complete{Complete: resolved},
	}); err != nil {
		t.Fatal(err)
	}
	// The holder's caller does not get the response the store refused: it
	// is told to retry, and its retry gets what the store holds.
	holder := <-done
	wantStatus(t, holder.err, codes.Aborted, idemgate.ReasonInFlight)
	if got := h.Gate.Stats().Fenced; got < 1 {
		t.Fatalf("Fenced = %d: the stale Finish was not refused", got)
	}
	r := shortLease(withKey("resolved-under"), h, req)
	if r.err != nil || r.resp.GetPayload() != "as the provider recorded it" {
		t.Fatalf("after the stale Finish: %v %v, want the resolved outcome", r.resp, r.err)
	}
}

// loseBeginReplyAndDelayFollowUp loses the answer of the first Begin of key
// and holds that attempt's follow-ups (the ReleaseLostBegins naming it, or
// its re-sent Begins) until release is closed, as a congested path to the
// Dedupe service would.
func loseBeginReplyAndDelayFollowUp(key string, release <-chan struct{}) grpc.UnaryClientInterceptor {
	var token atomic.Pointer[string]
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if lost, ok := req.(*idemgatev1.ReleaseLostBeginsRequest); ok {
			for _, l := range lost.GetLostBegins() {
				if t := token.Load(); t != nil && *t == l.GetAttemptToken() {
					select {
					case <-release:
					case <-ctx.Done():
						return status.FromContextError(ctx.Err()).Err()
					}
					break
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		begin, ok := req.(*idemgatev1.BeginRequest)
		if !ok || begin.GetKey() != key {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if t := token.Load(); t != nil && *t == begin.GetAttemptToken() {
			select {
			case <-release:
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		first := begin.GetAttemptToken()
		if !token.CompareAndSwap(nil, &first) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "test: the answer to Begin was lost")
	}
}

func TestLateFollowUpOfALostBeginFreesTheKey(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	h := setupWith(t, stacktest.Config{
		DedupeClientInterceptor: loseBeginReplyAndDelayFollowUp("late-follow-up", release),
		GateOptions:             []interceptor.Option{interceptor.WithDedupeTimeout(30 * time.Second)},
	})
	req := &testingv1.MutateRequest{Payload: "charge"}
	wantStatus(t, shortLease(withKey("late-follow-up"), h, req).err, codes.Unavailable, idemgate.ReasonStoreUnavailable)
	// The follow-up is held past the lease: a duplicate finds the lease run
	// out and, under FAIL_CLOSED, the record marked outcome-unknown; through
	// this gate, which knows its lost Begin never ran, it is told in flight
	// (issue 31 item 2), not outcome-unknown.
	time.Sleep(pastLease)
	wantStatus(t, shortLease(withKey("late-follow-up"), h, req).err, codes.Aborted, idemgate.ReasonInFlight)
	// The holder never ran its handler: its late follow-up takes the record
	// back and releases it, so the key is not blocked for days.
	close(release)
	var r result
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r = shortLease(withKey("late-follow-up"), h, req)
		// Unknown until the follow-up takes the record back, in flight until
		// it has released it.
		reason := grpcerr.Reason(r.err)
		if reason != idemgate.ReasonOutcomeUnknown && reason != idemgate.ReasonInFlight || time.Now().After(deadline) {
			break
		}
	}
	if r.err != nil || h.svc.Executions() != 1 {
		t.Fatalf("after the late follow-up: %v after %d executions, want the call to run once", r.err, h.svc.Executions())
	}
}

// slowBeginReply delivers the answer of the first Begin of key late, after
// the reservation it made has used up most of its lease; reservedAt is
// closed when the reservation is made.
func slowBeginReply(key string, late time.Duration, reservedAt chan<- struct{}) grpc.UnaryClientInterceptor {
	var once sync.Once
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if begin, ok := req.(*idemgatev1.BeginRequest); ok && begin.GetKey() == key && err == nil {
			once.Do(func() {
				close(reservedAt)
				time.Sleep(late)
			})
		}
		return err
	}
}

func TestSlowBeginAnswerIsRenewedAtOnce(t *testing.T) {
	t.Parallel()
	reservedAt := make(chan struct{})
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: slowBeginReply("slow-begin", 3*time.Second, reservedAt)})
	req := &testingv1.MutateRequest{Payload: "slow", Delay: durationpb.New(3 * time.Second)}
	firstDone := make(chan error, 1)
	go func() {
		_, err := h.client.MutateHeldReexecute(withKey("slow-begin"), req)
		firstDone <- err
	}()
	<-reservedAt
	// 4.15s into a 4s lease whose answer arrived after 3s: a holder that
	// waited a third of the lease before its first renewal has lost it.
	time.Sleep(4150 * time.Millisecond)
	_, err := h.client.MutateHeldReexecute(withKey("slow-begin"), req)
	wantStatus(t, err, codes.Aborted, idemgate.ReasonInFlight)
	if err := <-firstDone; err != nil {
		t.Fatalf("first call: %v", err)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("%d executions, want 1", got)
	}
}

func TestUnreadableOutcomeIsNotRetriedAsAnOutage(t *testing.T) {
	t.Parallel()
	unreadable := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == idemgatev1.DedupeService_Begin_FullMethodName {
			return grpcerr.New(codes.Internal, dedupesvc.ReasonOutcomeUnreadable, "the outcome was sealed with key k1, which this service does not have", nil, 0)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: unreadable})
	r := h.mutate(withKey("sealed"), &testingv1.MutateRequest{})
	wantStatus(t, r.err, codes.Internal, idemgate.ReasonStoreRejected)
	if h.svc.Executions() != 0 || h.Gate.Stats().LostBegins != 0 {
		t.Fatalf("%d executions, %d lost Begins: an unreadable outcome must neither run the handler nor be taken for a lost answer", h.svc.Executions(), h.Gate.Stats().LostBegins)
	}
}
