package interceptor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// pastLease is long enough for a 1s lease to have run out.
const pastLease = 1300 * time.Millisecond

// failWhile is a Dedupe client interceptor that fails one RPC with
// UNAVAILABLE, before it reaches the service, while failing reports true.
func failWhile(fullMethod string, failing func() bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == fullMethod && failing() {
			return status.Errorf(codes.Unavailable, "test: %s cannot get through", method)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// crash reserves key for method as a tool server would, then never finishes,
// as if the process died mid-call.
func (h *harness) crash(t *testing.T, fullMethod, key string, req *testingv1.MutateRequest, policy idemgate.Policy) {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256(b)
	res, err := h.Dedupe.Begin(context.Background(), &idemgatev1.BeginRequest{
		Scope: fullMethod, Key: key, Fingerprint: fp[:], AttemptToken: "crashed-" + key,
		Lease: durationpb.New(policy.Lease), Retention: durationpb.New(policy.Retention), OnLostOutcome: policy.OnLostOutcome,
	})
	if err != nil || res.GetReserved() == nil {
		t.Fatalf("crash Begin = %v, %v; want reserved", res, err)
	}
}

func shortLease(ctx context.Context, h *harness, req *testingv1.MutateRequest) result {
	var header []string
	md := grpcHeader{}
	resp, err := h.client.MutateShortLease(ctx, req, grpc.Header(&md.MD))
	header = md.Get(idemgate.ReplayedHeader)
	r := result{resp: resp, err: err, replayed: len(header) == 1 && header[0] == "true"}
	if resp != nil {
		r.raw = h.codec.bytesOf(resp)
	}
	return r
}

func TestLostOutcomeFailsClosedUntilResolved(t *testing.T) {
	t.Parallel()
	h := setupWith(t, stacktest.Config{ToolInterceptors: []grpc.UnaryServerInterceptor{recovery.UnaryServerInterceptor()}})
	method := testingv1.TestService_MutateShortLease_FullMethodName
	policy := h.Gate.Policy(method)

	t.Run("tool server killed mid-call, then resolved as completed", func(t *testing.T) {
		req := &testingv1.MutateRequest{Payload: "charge A"}
		h.crash(t, method, "killed", req, policy)
		time.Sleep(pastLease)

		r := shortLease(withKey("killed"), h, req)
		wantStatus(t, r.err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
		if h.svc.Executions() != 0 {
			t.Fatal("the handler ran for a key whose outcome is unknown")
		}
		// Asked again, still unknown: it never silently runs.
		wantStatus(t, shortLease(withKey("killed"), h, req).err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)

		found, _ := anypb.New(&testingv1.MutateResponse{Payload: "charge A, as the provider recorded it"})
		if _, err := h.Dedupe.Resolve(context.Background(), &idemgatev1.ResolveRequest{
			Scope: method, Key: "killed", Resolution: &idemgatev1.ResolveRequest_Complete{Complete: found},
		}); err != nil {
			t.Fatal(err)
		}
		r = shortLease(withKey("killed"), h, req)
		if r.err != nil || !r.replayed || r.resp.GetPayload() != "charge A, as the provider recorded it" {
			t.Fatalf("after Resolve(complete): %v %v replayed=%v, want the resolved outcome replayed", r.resp, r.err, r.replayed)
		}
		if h.svc.Executions() != 0 {
			t.Fatal("the handler ran after the record was completed")
		}
	})

	t.Run("handler panicked, then resolved as not run", func(t *testing.T) {
		req := &testingv1.MutateRequest{Payload: "charge B", Panic: true}
		r := shortLease(withKey("panicked"), h, req)
		if r.err == nil || !strings.Contains(r.err.Error(), "panicking on request") {
			t.Fatalf("panicking call: %v, want the recovery interceptor's error", r.err)
		}
		before := h.svc.Executions()
		time.Sleep(pastLease)
		wantStatus(t, shortLease(withKey("panicked"), h, req).err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
		if h.svc.Executions() != before {
			t.Fatal("the handler ran again after a panic")
		}
		if got := h.Gate.Stats().OutcomesLost; got < 1 {
			t.Errorf("OutcomesLost = %d after a panic, want it counted", got)
		}
		if _, err := h.Dedupe.Resolve(context.Background(), &idemgatev1.ResolveRequest{
			Scope: method, Key: "panicked", Resolution: &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}},
		}); err != nil {
			t.Fatal(err)
		}
		ok := shortLease(withKey("panicked"), h, &testingv1.MutateRequest{Payload: "charge B"})
		wantStatus(t, ok.err, codes.FailedPrecondition, idemgate.ReasonKeyReused) // another request: still refused
		shortLease(withKey("panicked"), h, req)                                   // the same request runs (and panics) again
		if h.svc.Executions() != before+1 {
			t.Fatalf("after Resolve(release) the handler ran %d more times, want 1", h.svc.Executions()-before)
		}
	})

	t.Run("Resolve of a record that is not unknown is refused", func(t *testing.T) {
		req := &testingv1.MutateRequest{Payload: "charge C"}
		if r := shortLease(withKey("settled"), h, req); r.err != nil {
			t.Fatal(r.err)
		}
		_, err := h.Dedupe.Resolve(context.Background(), &idemgatev1.ResolveRequest{
			Scope: method, Key: "settled", Resolution: &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}},
		})
		wantStatus(t, err, codes.FailedPrecondition, "RECORD_NOT_UNKNOWN")
		_, err = h.Dedupe.Resolve(context.Background(), &idemgatev1.ResolveRequest{
			Scope: method, Key: "never-used", Resolution: &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}},
		})
		wantStatus(t, err, codes.NotFound, "RECORD_NOT_FOUND")
	})
}

func TestReconcilerAnswersLostOutcomes(t *testing.T) {
	t.Parallel()
	method := testingv1.TestService_MutateShortLease_FullMethodName
	var asked atomic.Int64
	reconciler := func(_ context.Context, key string, req proto.Message) (idemgate.Resolution, error) {
		asked.Add(1)
		switch key {
		case "provider-has-it":
			return idemgate.ResolvedResponse(&testingv1.MutateResponse{Payload: "found at the provider: " + req.(*testingv1.MutateRequest).GetPayload(), Key: key}), nil
		case "provider-never-saw-it":
			return idemgate.ResolvedNotRun(), nil
		default:
			return idemgate.StillUnknown(), nil
		}
	}
	h := setup(t, interceptor.WithReconciler(method, reconciler))
	policy := h.Gate.Policy(method)
	req := &testingv1.MutateRequest{Payload: "charge"}
	for _, key := range []string{"provider-has-it", "provider-never-saw-it", "provider-unsure"} {
		h.crash(t, method, key, req, policy)
	}
	time.Sleep(pastLease)

	r := shortLease(withKey("provider-has-it"), h, req)
	if r.err != nil || r.resp.GetPayload() != "found at the provider: charge" || !r.replayed {
		t.Fatalf("reconciled as done: %v %v replayed=%v, want the provider's outcome without error", r.resp, r.err, r.replayed)
	}
	again := shortLease(withKey("provider-has-it"), h, req)
	if again.err != nil || !bytes.Equal(again.raw, r.raw) {
		t.Fatalf("a duplicate after reconciling: %v, bytes %x, want %x", again.err, again.raw, r.raw)
	}
	if h.svc.Executions() != 0 {
		t.Fatal("the handler ran for an action the provider had done")
	}

	r = shortLease(withKey("provider-never-saw-it"), h, req)
	if r.err != nil || r.replayed || r.resp.GetExecution() != 1 {
		t.Fatalf("reconciled as not run: %v %v replayed=%v, want a fresh run", r.resp, r.err, r.replayed)
	}

	wantStatus(t, shortLease(withKey("provider-unsure"), h, req).err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
	if got := asked.Load(); got != 3 {
		t.Errorf("reconciler asked %d times, want 3 (a settled record is never asked about again)", got)
	}
}

func TestReexecuteLetsExactlyOneTakerRun(t *testing.T) {
	t.Parallel()
	h := setup(t)
	method := testingv1.TestService_MutateReexecute_FullMethodName
	req := &testingv1.MutateRequest{Payload: "restartable"}
	h.crash(t, method, "taken-over", req, h.Gate.Policy(method))
	time.Sleep(pastLease)

	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, 32)
	for i := range errs {
		wg.Go(func() {
			<-start
			_, errs[i] = h.client.MutateReexecute(withKey("taken-over"), req)
		})
	}
	close(start)
	wg.Wait()
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("%d of 32 takers ran the handler, want exactly 1", got)
	}
	for i, err := range errs {
		if err != nil && grpcerr.Reason(err) != idemgate.ReasonInFlight {
			t.Errorf("taker %d: %v, want the response or IDEMPOTENCY_IN_FLIGHT", i, err)
		}
	}
}

func TestFencedOwnerCannotOverwriteTheNewerOutcome(t *testing.T) {
	t.Parallel()
	// Heartbeats never arrive: the first owner's lease runs out while it runs.
	dropHeartbeats := failWhile(idemgatev1.DedupeService_Heartbeat_FullMethodName, func() bool { return true })
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: dropHeartbeats})
	req := &testingv1.MutateRequest{Payload: "slow", Delay: durationpb.New(2500 * time.Millisecond)}

	firstDone := make(chan error, 1)
	go func() {
		_, err := h.client.MutateReexecute(withKey("fenced"), req)
		firstDone <- err
	}()
	time.Sleep(pastLease)
	second, err := h.client.MutateReexecute(withKey("fenced"), req)
	if err != nil {
		t.Fatalf("the taker: %v", err)
	}
	if second.GetExecution() != 2 {
		t.Fatal("the taker did not run: the lease was not taken over")
	}
	// The first owner's Finish was refused, so its caller does not get the
	// response nobody else will see: it is told to retry.
	wantStatus(t, <-firstDone, codes.Aborted, idemgate.ReasonInFlight)
	if err := h.Gate.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	replay, err := h.client.MutateReexecute(withKey("fenced"), req)
	if err != nil || replay.GetExecution() != second.GetExecution() {
		t.Fatalf("replay = execution %d (%v), want the newer owner's %d", replay.GetExecution(), err, second.GetExecution())
	}
	if got := h.Gate.Stats().Fenced; got < 1 {
		t.Errorf("Fenced = %d, want the stale owner's refused Finish counted", got)
	}
}

func TestHeartbeatsKeepASlowHandler(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{Payload: "slow", Delay: durationpb.New(5 * time.Second)}
	done := make(chan error, 1)
	go func() { _, err := h.client.MutateReexecute(withKey("slow"), req); done <- err }()

	// Three duplicates over more than three 1s leases: none may take over.
	for range 3 {
		time.Sleep(pastLease)
		_, err := h.client.MutateReexecute(withKey("slow"), req)
		if err == nil {
			t.Fatal("a duplicate got an answer while the original still ran")
		}
		wantStatus(t, err, codes.Aborted, idemgate.ReasonInFlight)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}

func TestDuplicateWaitsForTheOriginal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     stacktest.Config
		replica bool
	}{
		// A 10s poll is longer than max_wait (3s): only NOTIFY can wake it in time.
		{"woken by NOTIFY", stacktest.Config{PollInterval: 10 * time.Second}, false},
		{"NOTIFY off, polling", stacktest.Config{NoNotify: true, PollInterval: 100 * time.Millisecond}, false},
		{"on a second replica, woken by NOTIFY", stacktest.Config{PollInterval: 10 * time.Second}, true},
		{"on a second replica, polling", stacktest.Config{NoNotify: true, PollInterval: 100 * time.Millisecond}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setupWith(t, tt.cfg)
			duplicate, waiter := h.client, h.Service
			if tt.replica {
				cfg := tt.cfg
				cfg.ToolDial = []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodec(h.codec))}
				conn, service := h.SecondTool(t, h.register, cfg)
				duplicate, waiter = testingv1.NewTestServiceClient(conn), service
			}
			req := &testingv1.MutateRequest{Payload: "charge", Delay: durationpb.New(time.Second)}
			originalDone := make(chan result, 1)
			go func() { originalDone <- h.mutate(withKey("wait-for-me"), req) }()
			time.Sleep(300 * time.Millisecond)

			var header grpcHeader
			resp, err := duplicate.Mutate(withKey("wait-for-me"), req, grpc.Header(&header.MD))
			if err != nil {
				t.Fatalf("the duplicate: %v, want it to wait and get the original's outcome", err)
			}
			original := <-originalDone
			if original.err != nil {
				t.Fatal(original.err)
			}
			if raw := h.codec.bytesOf(resp); !bytes.Equal(raw, original.raw) {
				t.Fatalf("the duplicate got %x, want the original's bytes %x", raw, original.raw)
			}
			if v := header.Get(idemgate.ReplayedHeader); len(v) != 1 || v[0] != "true" {
				t.Error("the waited-for response is not marked replayed")
			}
			if got := h.svc.Executions(); got != 1 {
				t.Fatalf("handler ran %d times, want 1", got)
			}
			stats := waiter.WaitStats()
			if stats.Started != 1 || stats.Outcomes != 1 {
				t.Fatalf("wait stats %+v: the duplicate did not wait on the Dedupe service it called", stats)
			}
			if !tt.cfg.NoNotify && stats.Notified == 0 {
				t.Fatalf("wait stats %+v: NOTIFY never woke the waiter (the 10s poll cannot have)", stats)
			}
		})
	}

	t.Run("past max_wait the duplicate gets ABORTED", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		req := &testingv1.MutateRequest{Payload: "long", Delay: durationpb.New(4500 * time.Millisecond)}
		go h.mutate(withKey("too-slow"), req)
		time.Sleep(300 * time.Millisecond)
		r := h.mutate(withKey("too-slow"), req)
		wantStatus(t, r.err, codes.Aborted, idemgate.ReasonInFlight)
		if _, ok := grpcerr.RetryDelay(r.err); !ok {
			t.Error("ABORTED without RetryInfo")
		}
	})
}

func TestErrorOutcomes(t *testing.T) {
	t.Parallel()
	h := setup(t)
	call := func(key string, req *testingv1.MutateRequest) error {
		_, err := h.client.MutateReplayErrors(withKey(key), req)
		return err
	}
	statusBytes := func(err error) []byte {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(status.Convert(err).Proto())
		return b
	}
	tests := []struct {
		name      string
		req       *testingv1.MutateRequest
		wantFinal bool
	}{
		{"a replay code is final", &testingv1.MutateRequest{FailCode: int32(codes.InvalidArgument), FailDetail: "CARD_DECLINED"}, true},
		{"another code is retryable", &testingv1.MutateRequest{FailCode: int32(codes.Unavailable), FailDetail: "PROVIDER_DOWN"}, false},
		{"FinalError overrides a retryable code", &testingv1.MutateRequest{FailCode: int32(codes.Unavailable), FailMark: testingv1.ErrorMark_ERROR_MARK_FINAL}, true},
		{"RetryableError overrides a replay code", &testingv1.MutateRequest{FailCode: int32(codes.InvalidArgument), FailMark: testingv1.ErrorMark_ERROR_MARK_RETRYABLE}, false},
	}
	for i, tt := range tests {
		key := "error-" + string(rune('a'+i))
		before := h.svc.Executions()
		first := call(key, tt.req)
		second := call(key, tt.req)
		ran := h.svc.Executions() - before
		if status.Code(first) != codes.Code(tt.req.GetFailCode()) {
			t.Errorf("%s: first call %v, want code %v", tt.name, first, codes.Code(tt.req.GetFailCode()))
		}
		if tt.wantFinal {
			if ran != 1 || !bytes.Equal(statusBytes(first), statusBytes(second)) {
				t.Errorf("%s: ran %d times; replay %v, want one run and the byte-identical error %v", tt.name, ran, second, first)
			}
			if tt.req.GetFailDetail() != "" && grpcerr.Reason(second) != tt.req.GetFailDetail() {
				t.Errorf("%s: the replayed error lost its details: %v", tt.name, status.Convert(second).Details())
			}
		} else if ran != 2 {
			t.Errorf("%s: ran %d times, want the retry to run again", tt.name, ran)
		}
	}
}

func TestOutcomeThatCannotBeStoredGoesUnknown(t *testing.T) {
	t.Parallel()
	var storeDown atomic.Bool
	failFinish := failWhile(idemgatev1.DedupeService_Finish_FullMethodName, storeDown.Load)
	h := setupWith(t, stacktest.Config{
		DedupeClientInterceptor: failFinish,
		GateOptions:             []interceptor.Option{interceptor.WithFinishRetryBudget(time.Second)},
	})
	req := &testingv1.MutateRequest{Payload: "charge"}
	storeDown.Store(true)
	r := shortLease(withKey("unstored"), h, req)
	// Not stored within the budget (1s, the lease): told to retry, never
	// answered with an outcome the key does not keep.
	wantStatus(t, r.err, codes.Aborted, idemgate.ReasonInFlight)
	if err := h.Gate.Close(context.Background()); err != nil { // the background retries give up
		t.Fatal(err)
	}
	storeDown.Store(false)
	time.Sleep(pastLease)

	wantStatus(t, shortLease(withKey("unstored"), h, req).err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times, want 1: never silently re-run", got)
	}
	stats := h.Gate.Stats()
	if stats.OutcomesLost != 1 || stats.FinishRetries < 1 {
		t.Fatalf("stats %+v, want one lost outcome after at least one retry", stats)
	}
}

func TestFinishRetriedInBackgroundStoresTheOutcome(t *testing.T) {
	t.Parallel()
	var failures atomic.Int64
	failures.Store(2)
	flakyFinish := failWhile(idemgatev1.DedupeService_Finish_FullMethodName, func() bool { return failures.Add(-1) >= 0 })
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: flakyFinish})
	req := &testingv1.MutateRequest{Payload: "charge"}
	first := shortLease(withKey("flaky"), h, req)
	if first.err != nil {
		t.Fatal(first.err)
	}
	if err := h.Gate.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	again := shortLease(withKey("flaky"), h, req)
	if again.err != nil || !again.replayed || !bytes.Equal(again.raw, first.raw) {
		t.Fatalf("after the retried Finish: %v replayed=%v, want the stored outcome", again.err, again.replayed)
	}
	if stats := h.Gate.Stats(); stats.FinishRetries < 1 || stats.OutcomesLost != 0 {
		t.Fatalf("stats %+v, want retries and nothing lost", stats)
	}
}

// While an outcome waits in the background for the Dedupe service to take
// it, the reservation is still renewed: a duplicate past the lease must not
// take a REEXECUTE key over and run the side effect a second time. The first
// caller, its outcome not stored within a lease, was told to retry.
func TestFinishRetriesKeepTheReservation(t *testing.T) {
	t.Parallel()
	var finishDown atomic.Bool
	failFinish := failWhile(idemgatev1.DedupeService_Finish_FullMethodName, finishDown.Load)
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: failFinish})
	req := &testingv1.MutateRequest{Payload: "charge"}
	finishDown.Store(true)
	_, err := h.client.MutateReexecute(withKey("retrying"), req)
	wantStatus(t, err, codes.Aborted, idemgate.ReasonInFlight)
	time.Sleep(2 * pastLease)
	_, err = h.client.MutateReexecute(withKey("retrying"), req)
	wantStatus(t, err, codes.Aborted, idemgate.ReasonInFlight)

	finishDown.Store(false)
	if err := h.Gate.Close(context.Background()); err != nil { // the background retry stores it
		t.Fatal(err)
	}
	var header grpcHeader
	replay, err := h.client.MutateReexecute(withKey("retrying"), req, grpc.Header(&header.MD))
	if err != nil || replay.GetExecution() != 1 || header.Get(idemgate.ReplayedHeader) == nil {
		t.Fatalf("after the outcome was stored: %v, %v; want the first execution's response replayed", replay, err)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}

// A handler error whose Release cannot get through is retried in the
// background like a Finish: once the store takes it the key runs again,
// instead of the lease running out into an unknown outcome.
func TestReleaseRetriedInBackground(t *testing.T) {
	t.Parallel()
	var releaseDown atomic.Bool
	failRelease := failWhile(idemgatev1.DedupeService_Release_FullMethodName, releaseDown.Load)
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: failRelease})
	req := &testingv1.MutateRequest{Payload: "charge", FailCode: int32(codes.Unavailable)}
	releaseDown.Store(true)
	wantStatus(t, shortLease(withKey("releasing"), h, req).err, codes.Unavailable, "")
	time.Sleep(2 * pastLease) // past the 1s lease: only renewals keep the key from going unknown
	wantStatus(t, shortLease(withKey("releasing"), h, req).err, codes.Aborted, idemgate.ReasonInFlight)

	releaseDown.Store(false)
	if err := h.Gate.Close(context.Background()); err != nil { // the background retry releases it
		t.Fatal(err)
	}
	wantStatus(t, shortLease(withKey("releasing"), h, req).err, codes.Unavailable, "")
	if got := h.svc.Executions(); got != 2 {
		t.Fatalf("handler ran %d times, want 2: the released key runs again", got)
	}
	if stats := h.Gate.Stats(); stats.ReleaseRetries < 1 || stats.ReleaseFailures != 0 {
		t.Fatalf("stats %+v, want release retries and no failure", stats)
	}
}

// Heartbeats that fail three times in a row, for as long as a whole lease
// at the normal pace, still keep a slow handler's reservation: a failed
// renewal is retried soon, not a third of a lease later.
func TestHeartbeatsRideOutAFlakyStore(t *testing.T) {
	t.Parallel()
	var heartbeats atomic.Int64
	flaky := failWhile(idemgatev1.DedupeService_Heartbeat_FullMethodName, func() bool { return heartbeats.Add(1)%4 != 0 }) // 3 of every 4 fail
	h := setupWith(t, stacktest.Config{DedupeClientInterceptor: flaky})
	req := &testingv1.MutateRequest{Payload: "slow", Delay: durationpb.New(4 * time.Second)}
	done := make(chan error, 1)
	go func() { _, err := h.client.MutateReexecute(withKey("flaky-heartbeats"), req); done <- err }()

	for range 2 {
		time.Sleep(pastLease)
		_, err := h.client.MutateReexecute(withKey("flaky-heartbeats"), req)
		wantStatus(t, err, codes.Aborted, idemgate.ReasonInFlight)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	if stats := h.Gate.Stats(); stats.HeartbeatFailures < 3 {
		t.Fatalf("stats %+v, want the failed heartbeats counted", stats)
	}
}
