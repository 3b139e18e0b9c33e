package interceptor_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// FINISH_POLICY_AFTER_REPLY: the caller is answered first and the outcome
// stored right after (issue 12 item 4). Each test holds Finish back at the
// gate's Dedupe client, so "answered before the store" is an order the
// test controls, not a race it hopes to win.

// finishFault holds every Finish at the gate's Dedupe client until release
// is closed (or the call's context ends); then it sends it when land is
// set, or fails it with UNAVAILABLE, as a store that never takes it would.
type finishFault struct {
	land    bool
	release chan struct{}
	// begins receives once for every Begin sent, so a test knows a
	// duplicate is on its way before it lets the Finish through.
	begins chan struct{}
	// returned counts the Finishes that came back, landed or not.
	returned atomic.Int64
	// landed counts the Finishes the service took.
	landed atomic.Int64
}

func newFinishFault(land bool) *finishFault {
	return &finishFault{land: land, release: make(chan struct{}), begins: make(chan struct{}, 1024)}
}

func (f *finishFault) interceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch method {
		case idemgatev1.DedupeService_Begin_FullMethodName:
			select {
			case f.begins <- struct{}{}:
			default:
			}
		case idemgatev1.DedupeService_Finish_FullMethodName:
			defer f.returned.Add(1)
			select {
			case <-f.release:
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
			if !f.land {
				return status.Error(codes.Unavailable, "test: the store never takes this Finish")
			}
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil {
				f.landed.Add(1)
			}
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// afterReply calls MutateAfterReply (fail closed, duplicates wait) or
// MutateAfterReplyReexecute (duplicates in flight get ABORTED at once).
func (h *harness) afterReply(ctx context.Context, req *testingv1.MutateRequest, reexecute bool) result {
	var header grpcHeader
	call := h.client.MutateAfterReply
	if reexecute {
		call = h.client.MutateAfterReplyReexecute
	}
	resp, err := call(ctx, req, grpc.Header(&header.MD))
	r := result{resp: resp, err: err, replayed: len(header.Get(idemgate.ReplayedHeader)) == 1, header: header.MD}
	if resp != nil {
		r.raw = h.codec.bytesOf(resp)
	}
	return r
}

func TestAfterReplyAnswersBeforeTheOutcomeIsStored(t *testing.T) {
	t.Parallel()
	fault := newFinishFault(true)
	h := setupWith(t, stacktest.Config{
		DedupeClientInterceptor: fault.interceptor(),
		// A held Finish must not time out while the test holds it.
		GateOptions: []interceptor.Option{interceptor.WithOutcomeTimeout(time.Minute)},
	})
	if !h.Gate.Policy(testingv1.TestService_MutateAfterReply_FullMethodName).FinishAfterReply {
		t.Fatal("MutateAfterReply's policy does not say finish=after_reply")
	}
	if h.Gate.Policy(testingv1.TestService_Mutate_FullMethodName).FinishAfterReply {
		t.Fatal("a method without the finish option answers after the reply: the default must stay before_reply")
	}
	waitReq := &testingv1.MutateRequest{Payload: "answered first, waited for"}
	abortReq := &testingv1.MutateRequest{Payload: "answered first, in flight"}

	first := h.afterReply(withKey("after-reply-wait"), waitReq, false)
	if first.err != nil || first.replayed || first.resp.GetPayload() != waitReq.GetPayload() {
		t.Fatalf("first call: %v %v replayed=%v, want the fresh response", first.resp, first.err, first.replayed)
	}
	if n := fault.returned.Load(); n != 0 {
		t.Fatalf("the caller was answered after %d Finish attempts came back; FINISH_POLICY_AFTER_REPLY answers before the outcome is stored", n)
	}
	if got := first.header.Get(idemgate.ExpiresAtHeader); len(got) != 1 {
		t.Fatalf("%s = %q on an answer given before the store, want the expected expiry", idemgate.ExpiresAtHeader, got)
	}
	firstReexec := h.afterReply(withKey("after-reply-abort"), abortReq, true)
	if firstReexec.err != nil || fault.returned.Load() != 0 {
		t.Fatalf("first REEXECUTE call: %v with %d Finishes back, want it answered while its Finish is held", firstReexec.err, fault.returned.Load())
	}

	// Before the store: a duplicate that may not wait is told the call is
	// in flight, and a REEXECUTE duplicate does not take the key over.
	dup := h.afterReply(withKey("after-reply-abort"), abortReq, true)
	wantStatus(t, dup.err, codes.Aborted, idemgate.ReasonInFlight)

	// A duplicate that may wait waits for the outcome and gets it.
	for len(fault.begins) > 0 {
		<-fault.begins
	}
	waited := make(chan result, 1)
	go func() { waited <- h.afterReply(withKey("after-reply-wait"), waitReq, false) }()
	<-fault.begins // its Begin is on the way while the Finish is held
	close(fault.release)
	got := <-waited
	if got.err != nil || !got.replayed || !bytes.Equal(got.raw, first.raw) {
		t.Fatalf("waiting duplicate: %v replayed=%v bytes %x, want the first answer's bytes %x replayed", got.err, got.replayed, got.raw, first.raw)
	}
	again := retryUntilSettled(t, func() result { return h.afterReply(withKey("after-reply-abort"), abortReq, true) })
	if again.err != nil || !again.replayed || !bytes.Equal(again.raw, firstReexec.raw) {
		t.Fatalf("REEXECUTE duplicate after the store: %v replayed=%v, want the first answer's bytes replayed", again.err, again.replayed)
	}
	if n := h.svc.Executions(); n != 2 {
		t.Fatalf("%d executions for 2 keys", n)
	}
	if lost := h.Gate.Stats().OutcomesLost; lost != 0 {
		t.Fatalf("OutcomesLost = %d, want 0", lost)
	}
}

func TestAfterReplyRunsOncePerKeyUnderConcurrency(t *testing.T) {
	t.Parallel()
	// Every Finish takes longer than the 4s lease: only the lease keeper,
	// renewing until the background Finish lands, keeps a REEXECUTE
	// duplicate from taking the key over and running it again.
	h := setupWith(t, stacktest.Config{
		DedupeClientInterceptor: delayFinish(5 * time.Second),
		GateOptions:             []interceptor.Option{interceptor.WithOutcomeTimeout(time.Minute)},
	})
	const keys, callers = 8, 8
	var wg sync.WaitGroup
	answers := make([][][]byte, keys)
	for k := range keys {
		answers[k] = make([][]byte, callers)
		req := &testingv1.MutateRequest{Payload: fmt.Sprintf("concurrent-%d", k)}
		for c := range callers {
			wg.Go(func() {
				r := retryUntilSettled(t, func() result { return h.afterReply(withKey(req.GetPayload()), req, true) })
				if r.err != nil {
					t.Errorf("key %d caller %d: %v", k, c, r.err)
					return
				}
				answers[k][c] = r.raw
			})
		}
	}
	wg.Wait()
	if n := h.svc.Executions(); n != keys {
		t.Fatalf("%d executions for %d keys", n, keys)
	}
	for k := range keys {
		for c := 1; c < callers; c++ {
			if !bytes.Equal(answers[k][c], answers[k][0]) {
				t.Errorf("key %d: caller %d got %x, caller 0 got %x: every answer must be the one outcome's bytes", k, c, answers[k][c], answers[k][0])
			}
		}
	}
}

func TestAfterReplyFinishThatNeverLands(t *testing.T) {
	t.Parallel()
	fault := newFinishFault(false)
	h := setupWith(t, stacktest.Config{
		DedupeClientInterceptor: fault.interceptor(),
		GateOptions:             []interceptor.Option{interceptor.WithOutcomeTimeout(time.Minute), interceptor.WithFinishRetryBudget(time.Second)},
	})
	closedReq := &testingv1.MutateRequest{Payload: "never stored, fail closed"}
	reexecReq := &testingv1.MutateRequest{Payload: "never stored, reexecute"}
	// The callers are answered "ok" while their Finishes are held...
	closed := h.afterReply(withKey("never-lands-closed"), closedReq, false)
	reexec := h.afterReply(withKey("never-lands-reexec"), reexecReq, true)
	for _, r := range []result{closed, reexec} {
		if r.err != nil || r.replayed {
			t.Fatalf("first call: %v replayed=%v, want the fresh response", r.err, r.replayed)
		}
	}
	if n := fault.returned.Load(); n != 0 {
		t.Fatalf("callers answered after %d Finish attempts came back, want before", n)
	}
	// ...and then the store never takes them: the retries give up, the
	// renewals stop, and each record goes down its on_lost_outcome path
	// when the lease runs out.
	close(fault.release)

	t.Run("fail closed: the outcome is unknown", func(t *testing.T) {
		t.Parallel()
		r := retryUntilSettled(t, func() result { return h.afterReply(withKey("never-lands-closed"), closedReq, false) })
		wantStatus(t, r.err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
	})
	t.Run("reexecute: the side effect runs again", func(t *testing.T) {
		t.Parallel()
		r := retryUntilSettled(t, func() result { return h.afterReply(withKey("never-lands-reexec"), reexecReq, true) })
		if r.err != nil || r.replayed || r.resp.GetExecution() == reexec.resp.GetExecution() {
			t.Fatalf("duplicate: %v %v replayed=%v, want a second execution", r.resp, r.err, r.replayed)
		}
	})
	t.Cleanup(func() {
		if n := h.svc.Executions(); n != 3 {
			t.Errorf("%d executions, want 3: one per first call, one REEXECUTE re-run", n)
		}
		if lost := h.Gate.Stats().OutcomesLost; lost < 2 {
			t.Errorf("OutcomesLost = %d, want every given-up Finish counted", lost)
		}
		if fault.landed.Load() != 0 {
			t.Error("a Finish landed through a fault that fails them all")
		}
	})
}

func TestCloseDrainsAfterReplyFinishes(t *testing.T) {
	t.Parallel()
	t.Run("drained", func(t *testing.T) {
		t.Parallel()
		fault := newFinishFault(true)
		h := setupWith(t, stacktest.Config{
			DedupeClientInterceptor: fault.interceptor(),
			GateOptions:             []interceptor.Option{interceptor.WithOutcomeTimeout(time.Minute)},
		})
		req := &testingv1.MutateRequest{Payload: "drained by Close"}
		first := h.afterReply(withKey("close-drains"), req, false)
		if first.err != nil || fault.returned.Load() != 0 {
			t.Fatalf("first call: %v with %d Finishes back, want it answered while its Finish is held", first.err, fault.returned.Load())
		}
		// Close starts while the Finish is held, and the Finish is let go
		// only then: a Close that did not wait would return with none landed.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		closed := make(chan error, 1)
		go func() { closed <- h.Gate.Close(ctx) }()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while a Finish was held, want it to wait", err)
		case <-time.After(100 * time.Millisecond):
		}
		close(fault.release)
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if fault.landed.Load() != 1 {
			t.Fatalf("Close returned with %d Finishes landed, want it to wait for the pending one", fault.landed.Load())
		}
		dup := h.afterReply(withKey("close-drains"), req, false)
		if dup.err != nil || !dup.replayed || !bytes.Equal(dup.raw, first.raw) {
			t.Fatalf("duplicate after Close: %v replayed=%v, want the stored outcome", dup.err, dup.replayed)
		}
	})
	t.Run("context ends first", func(t *testing.T) {
		t.Parallel()
		fault := newFinishFault(true) // never released: only Close's context ends it
		h := setupWith(t, stacktest.Config{
			DedupeClientInterceptor: fault.interceptor(),
			GateOptions:             []interceptor.Option{interceptor.WithOutcomeTimeout(time.Minute)},
		})
		req := &testingv1.MutateRequest{Payload: "cut off by Close"}
		if first := h.afterReply(withKey("close-cuts"), req, false); first.err != nil {
			t.Fatal(first.err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := h.Gate.Close(ctx); err != context.Canceled {
			t.Fatalf("Close: %v, want its context's error", err)
		}
		// Close returned only after the pending Finish gave up.
		if lost := h.Gate.Stats().OutcomesLost; lost != 1 {
			t.Fatalf("OutcomesLost = %d after Close cut a pending Finish off, want 1", lost)
		}
		r := retryUntilSettled(t, func() result { return h.afterReply(withKey("close-cuts"), req, false) })
		wantStatus(t, r.err, codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown)
		if n := h.svc.Executions(); n != 1 {
			t.Fatalf("%d executions, want 1", n)
		}
	})
}

// A call that arrives after Close began (grpc's Stop does not wait for
// handlers) still has its outcome stored: nothing new starts in the
// background then, so the after-reply Finish is made before the answer, as
// FINISH_POLICY_BEFORE_REPLY would, instead of being given up at once.
func TestAfterReplyCallAfterCloseStoresItsOutcome(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Gate.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	req := &testingv1.MutateRequest{Payload: "after Close"}
	first := h.afterReply(withKey("after-close"), req, false)
	if first.err != nil {
		t.Fatalf("call after Close: %v", first.err)
	}
	if lost := h.Gate.Stats().OutcomesLost; lost != 0 {
		t.Fatalf("OutcomesLost = %d, want the outcome stored", lost)
	}
	dup := h.afterReply(withKey("after-close"), req, false)
	if dup.err != nil || !dup.replayed || !bytes.Equal(dup.raw, first.raw) {
		t.Fatalf("duplicate: %v replayed=%v, want the stored outcome", dup.err, dup.replayed)
	}
	if n := h.svc.Executions(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}
