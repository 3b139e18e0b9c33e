package gatecore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// The lifecycle through a transport that answers strings: each verdict's
// settlement, as the next call with the key sees it, against the real
// Dedupe service on the embedded store.

// stringTransport runs ran and replays a stored StringValue.
type stringTransport struct {
	ran       func(ctx context.Context) gatecore.Ran
	runs      atomic.Int64
	committed atomic.Int64
}

func (t *stringTransport) Replay(_ context.Context, s gatecore.Stored) (any, error, bool) {
	v := &wrapperspb.StringValue{}
	if err := s.Outcome.UnmarshalTo(v); err != nil {
		return nil, status.Error(codes.Internal, "not a string"), false
	}
	return v.GetValue(), nil, true
}

func (t *stringTransport) Run(ctx context.Context, _ *gatecore.Attempt) gatecore.Ran {
	t.runs.Add(1)
	return t.ran(ctx)
}

func (t *stringTransport) Committed(context.Context, time.Time) { t.committed.Add(1) }

func outcomeOf(t *testing.T, s string) *anypb.Any {
	t.Helper()
	a, err := gatecore.MarshalAny(wrapperspb.String(s))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func newEngine(t *testing.T, opts gatecore.Options) *gatecore.Engine {
	t.Helper()
	store, err := sqlitestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.Logger = logger
	e := gatecore.New(dedupesvc.NewInProcessClient(dedupesvc.NewServer(store, dedupesvc.WithNotifier(store), dedupesvc.WithLogger(logger))), opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	return e
}

func policy(lost idemgatev1.LostOutcomePolicy) gatecore.Policy {
	return gatecore.Policy{Lease: 10 * time.Second, ExecutionTimeout: time.Minute, OnLostOutcome: lost}
}

var fingerprint = sha256.Sum256([]byte("the request"))

func gateOnce(e *gatecore.Engine, key string, p gatecore.Policy, tr gatecore.Transport) (any, gatecore.Result, error) {
	c := gatecore.NewCall("tool", "scope", key, fingerprint[:], p, time.Hour)
	return e.Gate(context.Background(), c, tr, time.Now())
}

func TestGateSettlesEachVerdict(t *testing.T) {
	failClosed := policy(idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED)
	reexecute := policy(idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE)
	afterReply := failClosed
	afterReply.FinishAfterReply = true
	handlerErr := errors.New("the provider said no")
	cases := []struct {
		name   string
		policy gatecore.Policy
		ran    gatecore.Ran
		// wantErr is the first answer's reason ("" for the handler's own
		// answer); wantRuns is how many runs two calls make; wantAgain the
		// second call's reason, or its replayed answer.
		wantErr, wantAgain, wantAgainAnswer string
		wantRuns                            int64
	}{
		{name: "outcome stored and replayed", policy: failClosed, ran: gatecore.Ran{Verdict: gatecore.VerdictOutcome, Answer: "ch_1"},
			wantAgainAnswer: "ch_1", wantRuns: 1},
		{name: "after reply stored and replayed", policy: afterReply, ran: gatecore.Ran{Verdict: gatecore.VerdictOutcome, Answer: "ch_1"},
			wantAgainAnswer: "ch_1", wantRuns: 1},
		{name: "not run releases", policy: failClosed, ran: gatecore.Ran{Verdict: gatecore.VerdictNotRun, Err: handlerErr},
			wantRuns: 2},
		{name: "unknown fails closed", policy: failClosed, ran: gatecore.Ran{Verdict: gatecore.VerdictUnknown, Err: handlerErr, Code: "DEADLINE_EXCEEDED", Message: "timed out"},
			wantErr: idemgate.ReasonOutcomeUnknown, wantAgain: idemgate.ReasonOutcomeUnknown, wantRuns: 1},
		{name: "unknown reexecutes", policy: reexecute, ran: gatecore.Ran{Verdict: gatecore.VerdictUnknown, Err: handlerErr},
			wantRuns: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, gatecore.Options{})
			ran := tc.ran
			if ran.Verdict == gatecore.VerdictOutcome {
				ran.Outcome = outcomeOf(t, ran.Answer.(string))
			}
			tr := &stringTransport{ran: func(context.Context) gatecore.Ran { return ran }}
			answer, result, err := gateOnce(e, "k", tc.policy, tr)
			if result != gatecore.ResultExecuted {
				t.Fatalf("first call %v, want executed", result)
			}
			switch {
			case tc.wantErr != "":
				if grpcerr.Reason(err) != tc.wantErr {
					t.Fatalf("first call = %v, want %s", err, tc.wantErr)
				}
			case answer != ran.Answer || !errors.Is(err, ran.Err) && err != ran.Err:
				t.Fatalf("first call = %v, %v; want the handler's %v, %v", answer, err, ran.Answer, ran.Err)
			}
			var again any
			for range 100 { // after the reply the outcome is stored right after: in flight meanwhile
				again, _, err = gateOnce(e, "k", tc.policy, tr)
				if grpcerr.Reason(err) != idemgate.ReasonInFlight {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			switch {
			case tc.wantAgain != "":
				if grpcerr.Reason(err) != tc.wantAgain {
					t.Errorf("second call = %v, want %s", err, tc.wantAgain)
				}
			case tc.wantAgainAnswer != "":
				if err != nil || again != tc.wantAgainAnswer {
					t.Errorf("second call = %v, %v; want the replay %q", again, err, tc.wantAgainAnswer)
				}
			}
			if n := tr.runs.Load(); n != tc.wantRuns {
				t.Errorf("%d runs, want %d", n, tc.wantRuns)
			}
		})
	}
}

// A reconciler's outcome settles an outcome-unknown record: the call gets
// the replay, and the handler does not run.
func TestGateReconcilesALostOutcome(t *testing.T) {
	e := newEngine(t, gatecore.Options{})
	p := policy(idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED)
	tr := &stringTransport{ran: func(context.Context) gatecore.Ran {
		return gatecore.Ran{Verdict: gatecore.VerdictUnknown, Code: "DEADLINE_EXCEEDED", Message: "timed out"}
	}}
	if _, _, err := gateOnce(e, "k", p, tr); grpcerr.Reason(err) != idemgate.ReasonOutcomeUnknown {
		t.Fatalf("first call = %v, want %s", err, idemgate.ReasonOutcomeUnknown)
	}
	c := gatecore.NewCall("tool", "scope", "k", fingerprint[:], p, time.Hour)
	c.Reconcile = func(context.Context) (gatecore.Resolution, error) {
		return gatecore.ResolvedOutcome(outcomeOf(t, "found at the provider")), nil
	}
	answer, result, err := e.Gate(context.Background(), c, tr, time.Now())
	if err != nil || answer != "found at the provider" || result != gatecore.ResultReplayed {
		t.Fatalf("reconciled call = %v, %v, %v; want the reconciled outcome replayed", answer, err, result)
	}
	if n := tr.runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}

// A handler that panics loses its outcome (never released), and Gate
// panics again.
func TestGatePanickingHandlerLosesItsOutcome(t *testing.T) {
	e := newEngine(t, gatecore.Options{})
	p := policy(idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED)
	p.Lease = time.Second
	tr := &stringTransport{ran: func(context.Context) gatecore.Ran { panic("boom") }}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Gate did not panic again")
			}
		}()
		gateOnce(e, "k", p, tr)
	}()
	if got := e.Stats().OutcomesLost; got != 1 {
		t.Fatalf("outcomes lost = %d, want 1", got)
	}
	// Not released: in flight until the lease runs out, then unknown.
	_, _, err := gateOnce(e, "k", p, tr)
	if r := grpcerr.Reason(err); r != idemgate.ReasonInFlight && r != idemgate.ReasonOutcomeUnknown {
		t.Fatalf("duplicate = %v, want in flight or outcome unknown, never a run", err)
	}
	if n := tr.runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}

// The replay cache answers a duplicate of an outcome this engine stored,
// without a Dedupe call.
func TestGateReplayCacheAnswersAStoredOutcome(t *testing.T) {
	e := newEngine(t, gatecore.Options{ReplayCache: gatecore.NewReplayCache(10, 1<<20, time.Minute)})
	p := policy(idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED)
	tr := &stringTransport{ran: func(context.Context) gatecore.Ran {
		return gatecore.Ran{Verdict: gatecore.VerdictOutcome, Outcome: outcomeOf(t, "ch_1"), Answer: "ch_1"}
	}}
	gateOnce(e, "k", p, tr)
	answer, result, err := gateOnce(e, "k", p, tr)
	if err != nil || answer != "ch_1" || result != gatecore.ResultReplayed {
		t.Fatalf("duplicate = %v, %v, %v; want the replay", answer, err, result)
	}
	if s := e.Stats(); s.ReplayCacheHits != 1 || s.ReplayCacheMisses != 1 {
		t.Fatalf("cache hits %d misses %d, want 1 and 1", s.ReplayCacheHits, s.ReplayCacheMisses)
	}
	if tr.committed.Load() != 1 {
		t.Fatalf("committed told %d times, want once, for the run", tr.committed.Load())
	}
}

// A reconciler that fails leaves the outcome unknown
// (IDEMPOTENCY_OUTCOME_UNKNOWN); one whose answer cannot be stored is a
// bug, answered INTERNAL; neither runs the handler.
func TestGateReconcilerFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		code   codes.Code
		reason string
	}{
		{"fails", errors.New("the provider cannot say"), codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown},
		{"answer cannot be stored", gatecore.BadResolution(errors.New("answered a FooResponse, not a BarResponse")), codes.Internal, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, gatecore.Options{})
			p := policy(idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED)
			tr := &stringTransport{ran: func(context.Context) gatecore.Ran {
				return gatecore.Ran{Verdict: gatecore.VerdictUnknown, Code: "DEADLINE_EXCEEDED", Message: "timed out"}
			}}
			gateOnce(e, "k", p, tr)
			c := gatecore.NewCall("tool", "scope", "k", fingerprint[:], p, time.Hour)
			c.Reconcile = func(context.Context) (gatecore.Resolution, error) { return gatecore.StillUnknown(), tc.err }
			_, result, err := e.Gate(context.Background(), c, tr, time.Now())
			if status.Code(err) != tc.code || grpcerr.Reason(err) != tc.reason || result != gatecore.ResultRefused {
				t.Fatalf("reconciled call = %v (%v), want %v %q", err, result, tc.code, tc.reason)
			}
			if n := tr.runs.Load(); n != 1 {
				t.Fatalf("%d runs, want 1", n)
			}
		})
	}
}
