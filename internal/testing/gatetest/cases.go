package gatetest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// The refusal reasons the cases expect, as in docs/failure-semantics.md "Errors".
const (
	reasonKeyMissing       = "IDEMPOTENCY_KEY_MISSING"
	reasonKeyInvalid       = "IDEMPOTENCY_KEY_INVALID"
	reasonKeyReused        = "IDEMPOTENCY_KEY_REUSED"
	reasonInFlight         = "IDEMPOTENCY_IN_FLIGHT"
	reasonOutcomeUnknown   = "IDEMPOTENCY_OUTCOME_UNKNOWN"
	reasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
)

// settleWithin bounds how long a case retries a call that is refused while
// something settles (IDEMPOTENCY_IN_FLIGHT, IDEMPOTENCY_STORE_UNAVAILABLE):
// generous, for a starved scheduler; a gate that never settles fails it.
const settleWithin = 60 * time.Second

// Run runs the whole suite against the gates newGate starts. Every case is
// a parallel subtest with its own Dedupe service on its own PostgreSQL
// schema, so cases never see each other's records or faults.
func Run(t *testing.T, newGate NewGate) {
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"OncePerKey", testOncePerKey},
		{"ConcurrentDuplicatesInFlight", testConcurrentInFlight},
		{"ConcurrentDuplicatesWait", testConcurrentWait},
		{"KeyReusedWithOtherArguments", testKeyReused},
		{"OneKeyOnTwoMethods", testKeyOnTwoMethods},
		{"KeyMissing", testKeyMissing},
		{"KeyInvalid", testKeyInvalid},
		{"CallerGivesUp", testCallerGivesUp},
		{"ExecutionTimeout", testExecutionTimeout},
		{"RetryableFailureReleases", testRetryableReleases},
		{"UnlistedErrorReleases", testUnlistedErrorReleases},
		{"FinalErrorByPolicyReplayed", testFinalByPolicy},
		{"FinalErrorByMarkReplayed", testFinalByMark},
		{"FencedHolder", testFencedHolder},
		{"LostBeginAnswer", testLostBegin},
		{"OutcomeUnknownFailClosed", testUnknownFailClosed},
		{"OutcomeUnknownReexecute", testUnknownReexecute},
		{"AfterReply", testAfterReply},
		{"UnstoredOutcomeNotAnswered", testUnstoredNotAnswered},
		{"ReplayCache", testReplayCache},
		{"DedupeServiceDown", testDedupeDown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, setup(t, newGate))
		})
	}
}

func charge(label string, amount int64, b testingv1.Behaviour) *testingv1.ConformanceRequest {
	return &testingv1.ConformanceRequest{Label: label, Amount: amount, Behaviour: b}
}

const (
	succeed   = testingv1.Behaviour_BEHAVIOUR_UNSPECIFIED
	block     = testingv1.Behaviour_BEHAVIOUR_BLOCK
	waitCtx   = testingv1.Behaviour_BEHAVIOUR_WAIT_CONTEXT
	failRetry = testingv1.Behaviour_BEHAVIOUR_FAIL_RETRYABLE
)

// call makes one call within a generous deadline; a call the adapter cannot
// express fails the case with the adapter's reason.
func call(t *testing.T, c Client, method, key string, req *testingv1.ConformanceRequest) Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settleWithin)
	defer cancel()
	return checked(t, method, c.Call(ctx, method, key, req))
}

func checked(t *testing.T, method string, a Answer) Answer {
	t.Helper()
	if errors.Is(a.Err, ErrUnsupported) {
		t.Fatalf("%s: %v", method, a.Err)
	}
	return a
}

// settle calls until the answer is neither IDEMPOTENCY_IN_FLIGHT nor
// IDEMPOTENCY_STORE_UNAVAILABLE, as a client that retries with the same key
// does, and returns that answer. Every refusal on the way must carry a
// RetryInfo delay.
func settle(t *testing.T, c Client, method, key string, req *testingv1.ConformanceRequest) Answer {
	t.Helper()
	return settleThrough(t, c, method, key, req, "")
}

// settleThrough is settle that also retries through refusals with the
// reason transient (which need carry no RetryInfo).
func settleThrough(t *testing.T, c Client, method, key string, req *testingv1.ConformanceRequest, transient string) Answer {
	t.Helper()
	deadline := time.Now().Add(settleWithin)
	for {
		a := call(t, c, method, key, req)
		if a.Reason != reasonInFlight && a.Reason != reasonStoreUnavailable && (transient == "" || a.Reason != transient) {
			return a
		}
		if a.RetryAfter <= 0 && a.Reason != transient {
			t.Errorf("%s: refusal without RetryInfo: %v", method, a)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still refused after %v of retries with the same key: %v", method, settleWithin, a)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantResponse fails unless a is a response, replayed as said.
func wantResponse(t *testing.T, what string, a Answer, replayed bool) {
	t.Helper()
	if a.Err != nil || a.Response == nil {
		t.Fatalf("%s: got %v, want a response", what, a)
	}
	if a.Replayed != replayed {
		t.Fatalf("%s: replayed = %v, want %v (%v)", what, a.Replayed, replayed, a)
	}
}

// wantRefusal fails unless a is a refusal with code and reason.
func wantRefusal(t *testing.T, what string, a Answer, code codes.Code, reason string) {
	t.Helper()
	if a.Err == nil || a.Code != code || a.Reason != reason {
		t.Fatalf("%s: got %v, want %v %s", what, a, code, reason)
	}
}

// wantSameBytes fails unless b carries exactly a's bytes.
func wantSameBytes(t *testing.T, what string, a, b Answer) {
	t.Helper()
	if len(a.Body) == 0 || !bytes.Equal(a.Body, b.Body) {
		t.Fatalf("%s: bytes differ:\n first %q\n  then %q", what, a.Body, b.Body)
	}
}

// wantRuns fails unless the handler ran label n times.
func wantRuns(t *testing.T, e *env, label string, n int) {
	t.Helper()
	if got := e.ledger.runs(label); got != n {
		t.Fatalf("the handler ran %q %d times, want %d", label, got, n)
	}
}

// started waits for label's next execution to start.
func started(t *testing.T, e *env, label string) int {
	t.Helper()
	select {
	case n := <-e.ledger.entry(label).started:
		return n
	case <-time.After(settleWithin):
		t.Fatalf("the handler never started %q", label)
		return 0
	}
}

// async runs a call in the background; its answer arrives on the channel.
func async(t *testing.T, ctx context.Context, c Client, method, key string, req *testingv1.ConformanceRequest) <-chan Answer {
	out := make(chan Answer, 1)
	go func() { out <- c.Call(ctx, method, key, req) }()
	return out
}

func await(t *testing.T, what string, ch <-chan Answer) Answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(settleWithin):
		t.Fatalf("%s: no answer within %v", what, settleWithin)
		return Answer{}
	}
}

// testOncePerKey: sequential duplicates replay the first answer byte for
// byte, and the handler runs once.
func testOncePerKey(t *testing.T, e *env) {
	c, _ := e.gate(false)
	first := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantResponse(t, "first call", first, false)
	if first.Response.GetExecution() != 1 || first.Response.GetLabel() != "a" {
		t.Fatalf("first call answered %v, want execution 1 of %q", first.Response, "a")
	}
	for i := range 3 {
		again := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
		wantResponse(t, "duplicate", again, true)
		wantSameBytes(t, "duplicate", first, again)
		_ = i
	}
	wantRuns(t, e, "a", 1)
}

// testConcurrentInFlight: N concurrent duplicates while the first blocks:
// one execution; every other call is refused IDEMPOTENCY_IN_FLIGHT with
// RetryInfo (max_wait 0) and, retrying, replays the same bytes.
func testConcurrentInFlight(t *testing.T, e *env) {
	const n = 8
	c, _ := e.gate(false)
	firsts := make(chan Answer, n)
	answers := make([]Answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), settleWithin)
			defer cancel()
			first := true
			for {
				a := c.Call(ctx, MethodCharge, "k", charge("a", 100, block))
				if first {
					firsts <- a
					first = false
				}
				if a.Reason == reasonInFlight && ctx.Err() == nil {
					if a.RetryAfter <= 0 {
						t.Errorf("IDEMPOTENCY_IN_FLIGHT without RetryInfo: %v", a)
					}
					time.Sleep(100 * time.Millisecond)
					continue
				}
				answers[i] = a
				return
			}
		}()
	}
	started(t, e, "a")
	for range n - 1 {
		a := await(t, "a duplicate's first call", firsts)
		checked(t, MethodCharge, a)
		wantRefusal(t, "a duplicate while the first call runs", a, codes.Aborted, reasonInFlight)
	}
	e.ledger.release("a")
	wg.Wait()
	ran := 0
	for _, a := range answers {
		if a.Err != nil || a.Response == nil {
			t.Fatalf("a caller ended with %v, want the response", a)
		}
		if !a.Replayed {
			ran++
		}
		wantSameBytes(t, "concurrent duplicates", answers[0], a)
	}
	if ran != 1 {
		t.Fatalf("%d answers unmarked as replays, want 1", ran)
	}
	wantRuns(t, e, "a", 1)
}

// testConcurrentWait: N concurrent duplicates on a method whose duplicates
// wait (max_wait 10s): one execution, all the same bytes.
func testConcurrentWait(t *testing.T, e *env) {
	const n = 8
	c, _ := e.gate(false)
	answers := make([]Answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = settle(t, c, MethodChargeWait, "k", charge("a", 100, succeed))
		}()
	}
	wg.Wait()
	ran := 0
	for _, a := range answers {
		wantResponse(t, "a concurrent duplicate", a, a.Replayed)
		if !a.Replayed {
			ran++
		}
		wantSameBytes(t, "concurrent duplicates", answers[0], a)
	}
	if ran != 1 {
		t.Fatalf("%d answers unmarked as replays, want 1", ran)
	}
	wantRuns(t, e, "a", 1)
}

// testKeyReused: the key with other arguments is refused and not run.
func testKeyReused(t *testing.T, e *env) {
	c, _ := e.gate(false)
	wantResponse(t, "first call", call(t, c, MethodCharge, "k", charge("a", 100, succeed)), false)
	wantRefusal(t, "the key with another amount", call(t, c, MethodCharge, "k", charge("a", 200, succeed)),
		codes.FailedPrecondition, reasonKeyReused)
	wantRuns(t, e, "a", 1)
}

// testKeyOnTwoMethods: one key on two methods is two actions, each run
// once: the scope names the method.
func testKeyOnTwoMethods(t *testing.T, e *env) {
	c, _ := e.gate(false)
	wantResponse(t, "Charge", call(t, c, MethodCharge, "k", charge("a", 100, succeed)), false)
	wantResponse(t, "ChargeWait with the same key", call(t, c, MethodChargeWait, "k", charge("a", 100, succeed)), false)
	wantResponse(t, "Charge again", call(t, c, MethodCharge, "k", charge("a", 100, succeed)), true)
	wantRuns(t, e, "a", 2)
}

func testKeyMissing(t *testing.T, e *env) {
	c, _ := e.gate(false)
	wantRefusal(t, "a call without a key", call(t, c, MethodCharge, "", charge("a", 100, succeed)),
		codes.InvalidArgument, reasonKeyMissing)
	wantRuns(t, e, "a", 0)
}

func testKeyInvalid(t *testing.T, e *env) {
	c, _ := e.gate(false)
	wantRefusal(t, "a 256-byte key", call(t, c, MethodCharge, strings.Repeat("k", 256), charge("a", 100, succeed)),
		codes.InvalidArgument, reasonKeyInvalid)
	wantRuns(t, e, "a", 0)
}

// testCallerGivesUp: the caller cancels while the handler runs; the handler
// does not see it, completes, and the retry replays its outcome.
func testCallerGivesUp(t *testing.T, e *env) {
	c, _ := e.gate(false)
	ctx, cancel := context.WithCancel(context.Background())
	answer := async(t, ctx, c, MethodChargeWait, "k", charge("a", 100, block))
	started(t, e, "a")
	cancel()
	if a := checked(t, MethodChargeWait, await(t, "the cancelled call", answer)); a.Err == nil {
		t.Fatalf("the cancelled call answered %v, want an error", a)
	}
	// A call answered after the cancelled one returned: over one gRPC
	// connection the cancellation reached the server before it, so a gate
	// that let it through has ended the handler's context by now.
	wantResponse(t, "a call after the cancellation", call(t, c, MethodCharge, "probe", charge("probe", 1, succeed)), false)
	e.ledger.release("a")
	select {
	case err := <-e.ledger.entry("a").ended:
		if err != nil {
			t.Fatalf("the handler's context ended with %v when its caller gave up, want it to run on", err)
		}
	case <-time.After(settleWithin):
		t.Fatal("the handler never returned")
	}
	retry := settle(t, c, MethodChargeWait, "k", charge("a", 100, succeed))
	wantResponse(t, "the retry", retry, true)
	if retry.Response.GetExecution() != 1 {
		t.Fatalf("the retry got %v, want execution 1's outcome", retry.Response)
	}
	wantRuns(t, e, "a", 1)
}

// testExecutionTimeout: a handler that runs past execution_timeout, waiting
// on its context, leaves its outcome unknown (FAIL_CLOSED): its caller and
// the retry get IDEMPOTENCY_OUTCOME_UNKNOWN, and it does not run again.
func testExecutionTimeout(t *testing.T, e *env) {
	c, _ := e.gate(false)
	wantRefusal(t, "a handler past its execution timeout", call(t, c, MethodChargeBounded, "k", charge("a", 100, waitCtx)),
		codes.FailedPrecondition, reasonOutcomeUnknown)
	if err := <-e.ledger.entry("a").ended; err == nil {
		t.Fatal("the handler returned with its context live, want it ended by the execution timeout")
	}
	wantRefusal(t, "the retry", call(t, c, MethodChargeBounded, "k", charge("a", 100, succeed)),
		codes.FailedPrecondition, reasonOutcomeUnknown)
	wantRuns(t, e, "a", 1)
}

// testRetryableReleases: a retryable failure frees the key: the retry runs
// again and its success is stored.
func testRetryableReleases(t *testing.T, e *env) {
	c, _ := e.gate(false)
	failed := call(t, c, MethodCharge, "k", charge("a", 100, failRetry))
	if failed.Err == nil || failed.Code != codes.Unavailable || failed.Reason != "" {
		t.Fatalf("a retryable failure answered %v, want the handler's UNAVAILABLE", failed)
	}
	retry := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantResponse(t, "the retry", retry, false)
	wantRuns(t, e, "a", 2)
	again := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantResponse(t, "the next duplicate", again, true)
	wantSameBytes(t, "the next duplicate", retry, again)
	wantRuns(t, e, "a", 2)
}

// finalReplayed: a final error is stored and replayed, bytes and all, and
// the handler does not run again.
func finalReplayed(t *testing.T, e *env, method string, b testingv1.Behaviour, code codes.Code) {
	c, _ := e.gate(false)
	first := call(t, c, method, "k", charge("a", 100, b))
	if first.Err == nil || first.Code != code || first.Reason != "" {
		t.Fatalf("a final failure answered %v, want the handler's %v", first, code)
	}
	for range 2 {
		again := call(t, c, method, "k", charge("a", 100, succeed))
		if again.Err == nil || again.Code != code {
			t.Fatalf("a duplicate of a final failure answered %v, want its replay", again)
		}
		wantSameBytes(t, "the replayed final error", first, again)
	}
	wantRuns(t, e, "a", 1)
}

// testUnlistedErrorReleases: an unmarked error whose code the method's
// replay_codes do not list is not an outcome: the key is released and the
// retry runs again (ChargeReplayErrors would store the same error).
func testUnlistedErrorReleases(t *testing.T, e *env) {
	c, _ := e.gate(false)
	failed := call(t, c, MethodCharge, "k", charge("a", 100, testingv1.Behaviour_BEHAVIOUR_FAIL_FINAL))
	if failed.Err == nil || failed.Code != codes.FailedPrecondition || failed.Reason != "" {
		t.Fatalf("an unlisted error answered %v, want the handler's FAILED_PRECONDITION", failed)
	}
	wantResponse(t, "the retry", call(t, c, MethodCharge, "k", charge("a", 100, succeed)), false)
	wantRuns(t, e, "a", 2)
}

func testFinalByPolicy(t *testing.T, e *env) {
	finalReplayed(t, e, MethodChargeReplayErrors, testingv1.Behaviour_BEHAVIOUR_FAIL_FINAL, codes.FailedPrecondition)
}

func testFinalByMark(t *testing.T, e *env) {
	finalReplayed(t, e, MethodCharge, testingv1.Behaviour_BEHAVIOUR_FAIL_MARKED_FINAL, codes.Aborted)
}

// testFencedHolder: a REEXECUTE holder cut off from the Dedupe service past
// its lease is taken over by a duplicate on another gate, which runs; the
// holder's caller gets IDEMPOTENCY_IN_FLIGHT, not its own answer, and every
// later duplicate replays the taker's outcome.
func testFencedHolder(t *testing.T, e *env) {
	// The replay cache is on, so an outcome a gate caches before the store
	// took it would be replayed here in place of the stored one.
	holder, holderProxy := e.gate(true)
	other, _ := e.gate(true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*settleWithin)
	defer cancel()
	held := async(t, ctx, holder, MethodChargeReexecute, "k", charge("a", 100, block))
	started(t, e, "a")
	holderProxy.Blackhole() // its heartbeats stop reaching the service
	taken := settle(t, other, MethodChargeReexecute, "k", charge("a", 100, succeed))
	wantResponse(t, "the duplicate that took the key over", taken, false)
	if taken.Response.GetExecution() != 2 {
		t.Fatalf("the taker answered %v, want execution 2", taken.Response)
	}
	holderProxy.Heal()
	e.ledger.release("a")
	first := checked(t, MethodChargeReexecute, await(t, "the fenced holder's caller", held))
	wantRefusal(t, "the fenced holder's caller", first, codes.Aborted, reasonInFlight)
	for _, c := range []Client{holder, other} {
		again := settle(t, c, MethodChargeReexecute, "k", charge("a", 100, succeed))
		wantResponse(t, "a later duplicate", again, true)
		wantSameBytes(t, "a later duplicate", taken, again)
	}
	wantRuns(t, e, "a", 2)
}

// testLostBegin: the Dedupe service reserves the key but its answer is
// lost; the caller is told the store is unavailable, and the retry runs
// once, neither twice nor never.
func testLostBegin(t *testing.T, e *env) {
	c, p := e.gate(false)
	// A first call opens the gate's connection, so the fault below drops
	// only answers, not the connection's handshake.
	wantResponse(t, "a call before the fault", call(t, c, MethodCharge, "warm", charge("warm", 1, succeed)), false)
	p.DropReplies()
	lost := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
	if lost.Err == nil {
		t.Fatalf("a call whose Begin answer was lost answered %v", lost)
	}
	wantRefusal(t, "a call whose Begin answer was lost", lost, codes.Unavailable, reasonStoreUnavailable)
	if n := e.hooks.count("Begin", "k"); n == 0 {
		t.Fatal("the Begin never reached the Dedupe service: the fault came too early")
	}
	wantRuns(t, e, "a", 0)
	p.Heal()
	// The Begin's lease (4s) may run out before the gate gives up on it
	// (its Begin deadline), so a retry may find the record outcome-unknown
	// until the gate's follow-up of the lost Begin takes it back and
	// releases it; a gate without a follow-up leaves it so for good.
	retry := settleThrough(t, c, MethodCharge, "k", charge("a", 100, succeed), reasonOutcomeUnknown)
	wantResponse(t, "the retry", retry, false)
	wantRuns(t, e, "a", 1)
}

// testUnknownFailClosed: a handler error marked outcome-unknown under
// FAIL_CLOSED refuses the caller and every retry IDEMPOTENCY_OUTCOME_UNKNOWN
// until the record is resolved; then the next call runs.
func testUnknownFailClosed(t *testing.T, e *env) {
	c, _ := e.gate(false)
	unknown := testingv1.Behaviour_BEHAVIOUR_FAIL_UNKNOWN
	wantRefusal(t, "an outcome-unknown failure", call(t, c, MethodCharge, "k", charge("a", 100, unknown)),
		codes.FailedPrecondition, reasonOutcomeUnknown)
	wantRefusal(t, "the retry", call(t, c, MethodCharge, "k", charge("a", 100, succeed)),
		codes.FailedPrecondition, reasonOutcomeUnknown)
	wantRuns(t, e, "a", 1)
	if !e.resolveRelease("k") {
		t.Fatal("no outcome-unknown record of the key in the store")
	}
	after := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantResponse(t, "the call after the record was resolved", after, false)
	wantRuns(t, e, "a", 2)
}

// testUnknownReexecute: under REEXECUTE an outcome-unknown failure frees the
// key: the retry runs again.
func testUnknownReexecute(t *testing.T, e *env) {
	c, _ := e.gate(false)
	failed := call(t, c, MethodChargeReexecute, "k", charge("a", 100, testingv1.Behaviour_BEHAVIOUR_FAIL_UNKNOWN))
	if failed.Err == nil {
		t.Fatalf("an outcome-unknown failure answered %v, want an error", failed)
	}
	retry := settle(t, c, MethodChargeReexecute, "k", charge("a", 100, succeed))
	wantResponse(t, "the retry", retry, false)
	wantRuns(t, e, "a", 2)
	again := call(t, c, MethodChargeReexecute, "k", charge("a", 100, succeed))
	wantResponse(t, "the next duplicate", again, true)
	wantSameBytes(t, "the next duplicate", retry, again)
}

// testAfterReply: under FINISH_POLICY_AFTER_REPLY the caller is answered
// while its Finish is held at the Dedupe service; once stored, a duplicate
// replays it byte for byte; one execution.
func testAfterReply(t *testing.T, e *env) {
	c, _ := e.gate(false)
	hd := e.hooks.holdFinish("k")
	ctx, cancel := context.WithTimeout(context.Background(), settleWithin)
	defer cancel()
	answer := async(t, ctx, c, MethodChargeAfterReply, "k", charge("a", 100, succeed))
	first := checked(t, MethodChargeAfterReply, await(t, "the call", answer))
	select {
	case <-hd.reached:
	case <-time.After(settleWithin):
		t.Fatal("no Finish reached the Dedupe service")
	}
	pending, attempts := hd.letThrough()
	if !pending || attempts != 1 {
		t.Fatalf("the caller was answered after its Finish was given up (%d attempts): the gate stores the outcome before it replies", attempts)
	}
	wantResponse(t, "the call", first, false)
	again := settle(t, c, MethodChargeAfterReply, "k", charge("a", 100, succeed))
	wantResponse(t, "the duplicate", again, true)
	wantSameBytes(t, "the duplicate", first, again)
	wantRuns(t, e, "a", 1)
}

// testUnstoredNotAnswered: under FINISH_POLICY_BEFORE_REPLY a caller whose
// Finish the Dedupe service does not answer (held) is not answered with its
// response: the gate retries the Finish before answering, for at most a
// Finish attempt plus a lease, then refuses IDEMPOTENCY_IN_FLIGHT with
// RetryInfo. Once the Finish gets through, a retry replays the stored
// outcome; one execution.
func testUnstoredNotAnswered(t *testing.T, e *env) {
	c, _ := e.gate(false)
	hd := e.hooks.holdFinish("k")
	ctx, cancel := context.WithTimeout(context.Background(), settleWithin)
	defer cancel()
	sent := time.Now()
	first := checked(t, MethodCharge, await(t, "the call", async(t, ctx, c, MethodCharge, "k", charge("a", 100, succeed))))
	waited := time.Since(sent)
	_, attempts := hd.letThrough()
	t.Logf("the caller waited %v for its answer (%d Finish attempts): %v", waited, attempts, first)
	wantRefusal(t, "a call whose outcome was never stored", first, codes.Aborted, reasonInFlight)
	if first.RetryAfter <= 0 {
		t.Fatalf("IDEMPOTENCY_IN_FLIGHT without RetryInfo: %v", first)
	}
	if attempts < 2 {
		t.Fatalf("%d Finish attempts before the answer, want the failed one retried first", attempts)
	}
	again := settle(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantResponse(t, "the retry", again, true)
	wantRuns(t, e, "a", 1)
}

// testReplayCache: with the replay cache on, a duplicate is answered
// without a Begin at the Dedupe service, with the same bytes.
func testReplayCache(t *testing.T, e *env) {
	c, _ := e.gate(true)
	first := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantResponse(t, "first call", first, false)
	begins := e.hooks.count("Begin", "k")
	for range 3 {
		again := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
		wantResponse(t, "a duplicate", again, true)
		wantSameBytes(t, "a duplicate", first, again)
	}
	if n := e.hooks.count("Begin", "k"); n != begins {
		t.Fatalf("duplicates sent %d Begins to the Dedupe service, want none: the replay cache did not answer them", n-begins)
	}
	wantRuns(t, e, "a", 1)
}

// testDedupeDown: with the Dedupe service unreachable a call is refused
// IDEMPOTENCY_STORE_UNAVAILABLE with RetryInfo and the handler does not run;
// once it is back the retry runs once.
func testDedupeDown(t *testing.T, e *env) {
	c, p := e.gate(false)
	p.Reset()
	down := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantRefusal(t, "a call while the Dedupe service is down", down, codes.Unavailable, reasonStoreUnavailable)
	if down.RetryAfter <= 0 {
		t.Fatalf("IDEMPOTENCY_STORE_UNAVAILABLE without RetryInfo: %v", down)
	}
	wantRuns(t, e, "a", 0)
	p.Heal()
	retry := settle(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantResponse(t, "the retry", retry, false)
	wantRuns(t, e, "a", 1)
	again := call(t, c, MethodCharge, "k", charge("a", 100, succeed))
	wantResponse(t, "the next duplicate", again, true)
	wantRuns(t, e, "a", 1)
}
