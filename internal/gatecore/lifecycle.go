package gatecore

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// Transport is what one gated call's front end supplies to Gate: how a
// stored outcome becomes the caller's answer, how the handler runs and what
// its answer means, and where the replay headers go. Everything else (the
// replay cache, Begin and its reconciliation, the lease, the settlement, the
// fenced answer, FINISH_POLICY_AFTER_REPLY) is Gate's, so every transport
// keeps the same protocol.
type Transport interface {
	// Replay answers the caller from a stored outcome, first telling the
	// caller when it was stored and until when it is replayed (s's times,
	// when known). It reports replayed false, with the error to answer,
	// when the outcome is not one this call can replay (another type, a
	// ResultTooLarge marker): never a reason to run the handler again.
	Replay(ctx context.Context, s Stored) (answer any, err error, replayed bool)
	// Run runs the handler on ctx, the attempt's context (a's), and says
	// what its answer means.
	Run(ctx context.Context, a *Attempt) Ran
	// Committed is told, before a first execution's answer is returned,
	// until when its outcome is replayed (this process's estimate).
	Committed(ctx context.Context, expiresAt time.Time)
}

// Verdict is what a handler's answer means for the record.
type Verdict int

const (
	// VerdictOutcome: the answer (a response, or a final error) is the
	// action's outcome: it is stored, and the caller gets the answer.
	VerdictOutcome Verdict = iota + 1
	// VerdictNotRun: the side effect did not happen: the key is released so
	// a retry runs, and the caller gets the answer.
	VerdictNotRun
	// VerdictUnknown: the handler cannot tell whether its side effect
	// happened. Under REEXECUTE the key is released and the caller gets the
	// answer; under FAIL_CLOSED the record is marked outcome-unknown and the
	// caller gets HandlerOutcomeUnknown, as its retries will.
	VerdictUnknown
	// VerdictLost: the side effect may have happened but its outcome cannot
	// be stored (it does not serialize): the lease is left to run out, down
	// the on_lost_outcome path, and the caller gets the answer.
	VerdictLost
	// VerdictAbandoned: the answer cannot be stored and the front end says
	// why to its caller: the lease is left to run out, uncounted.
	VerdictAbandoned
)

// Ran is a handler's answer as Gate needs it.
type Ran struct {
	// Verdict says what the answer means.
	Verdict Verdict
	// Outcome is what is stored (VerdictOutcome).
	Outcome *anypb.Any
	// Answer and Err are what the caller gets.
	Answer any
	Err    error
	// Code and Message name the handler's error in the outcome-unknown
	// refusal (VerdictUnknown under FAIL_CLOSED).
	Code, Message string
	// Why and Attrs say why an outcome is lost (VerdictLost), for the log.
	Why   string
	Attrs []slog.Attr
}

// Result is how a gated call ended, for its metrics.
type Result string

const (
	// ResultExecuted: the handler ran.
	ResultExecuted Result = "executed"
	// ResultReplayed: a stored outcome answered.
	ResultReplayed Result = "replayed"
	// ResultRefused: neither; the error's reason says why.
	ResultRefused Result = ""
)

// Resolution is a reconciler's answer about a lost outcome.
type Resolution struct {
	kind    resolutionKind
	outcome *anypb.Any
}

type resolutionKind int

const (
	stillUnknown resolutionKind = iota
	resolvedOutcome
	resolvedNotRun
)

// ResolvedOutcome says the action ended with outcome (a response or a final
// error, as the front end stores them): it is stored and replayed.
func ResolvedOutcome(outcome *anypb.Any) Resolution {
	return Resolution{kind: resolvedOutcome, outcome: outcome}
}

// ResolvedNotRun says the side effect did not happen: the record is
// released and the call runs the handler.
func ResolvedNotRun() Resolution { return Resolution{kind: resolvedNotRun} }

// StillUnknown says the reconciler cannot tell: the caller gets
// IDEMPOTENCY_OUTCOME_UNKNOWN.
func StillUnknown() Resolution { return Resolution{} }

// BadResolution marks a reconciler's answer the front end cannot store (a
// response of another type, one that does not serialize): a bug, answered
// INTERNAL rather than IDEMPOTENCY_OUTCOME_UNKNOWN, which asks an operator
// to settle a record. The outcome stays unknown either way.
func BadResolution(err error) error { return &badResolution{err: err} }

type badResolution struct{ err error }

func (b *badResolution) Error() string { return b.err.Error() }

func (b *badResolution) Unwrap() error { return b.err }

// maxReconcileRounds bounds Begin after a reconciler settled a record: the
// next Begin normally replays or reserves, unless another caller raced.
const maxReconcileRounds = 3

// Gate runs one gated call from its key to its answer: the replay cache
// (Options.ReplayCache), Begin, the reconciler (c.Reconcile) of a lost
// outcome, the handler under a renewed lease (t.Run), the settlement its
// verdict asks for, before the answer or, under FINISH_POLICY_AFTER_REPLY,
// right after it, and the fenced answer. arrived is when the call reached
// the front end, for StagePrepare. A panicking handler is a lost outcome,
// and Gate panics again. The error is a gRPC status error with one
// ErrorInfo of idemgate's Reason constants, or the handler's own.
func (e *Engine) Gate(ctx context.Context, c *Call, t Transport, arrived time.Time) (answer any, result Result, err error) {
	fingerprint := c.BeginRequest.GetFingerprint()
	cache := e.opts.ReplayCache
	if cache != nil {
		c.Stored = func(outcome *anypb.Any, sent time.Time) {
			cache.Put(c.Scope, c.Key, fingerprint, Stored{Outcome: outcome, CompletedAt: sent, ExpiresAt: sent.Add(c.Retention)})
		}
		if stored, ok := cache.Get(c.Scope, c.Key, fingerprint); ok {
			e.Event(c, EventReplayCacheHit)
			return e.replay(ctx, c, t, stored, false)
		}
		e.Event(c, EventReplayCacheMiss)
	}
	e.Stage(c, StagePrepare, time.Since(arrived))
	for round := 0; ; round++ {
		begun, err := e.Begin(ctx, c)
		switch {
		case begun.Kind == Reserved:
			answer, err := e.run(ctx, c, t, begun)
			return answer, ResultExecuted, err
		case begun.Kind == Completed:
			return e.replay(ctx, c, t, Stored{Outcome: begun.Outcome, CompletedAt: begun.CompletedAt, ExpiresAt: begun.ExpiresAt}, true)
		case begun.Kind == Unknown && c.Reconcile != nil && round < maxReconcileRounds:
			if settled, err := e.reconcile(ctx, c); settled {
				return nil, ResultRefused, err
			}
			// Released, or settled by us or a racing caller: Begin again,
			// which replays or reserves.
		default:
			// In flight, another request, outcome unknown, or the Dedupe
			// service's failure.
			return nil, ResultRefused, err
		}
	}
}

// replay answers from a stored outcome, and keeps it in the replay cache
// when it came from the Dedupe service (fromService) and replayed.
func (e *Engine) replay(ctx context.Context, c *Call, t Transport, s Stored, fromService bool) (any, Result, error) {
	answer, err, replayed := t.Replay(ctx, s)
	if !replayed {
		return answer, ResultRefused, err
	}
	if cache := e.opts.ReplayCache; cache != nil && fromService {
		cache.Put(c.Scope, c.Key, c.BeginRequest.GetFingerprint(), s)
	}
	return answer, ResultReplayed, err
}

// reconcile asks the call's reconciler what happened to a lost outcome and
// settles the record with its answer. It reports settled, with the error to
// answer, or not settled when the caller should Begin again.
func (e *Engine) reconcile(ctx context.Context, c *Call) (settled bool, err error) {
	res, err := c.Reconcile(ctx)
	var bad *badResolution
	switch {
	case errors.As(err, &bad):
		e.opts.Logger.ErrorContext(ctx, "idemgate: the reconciler's answer cannot be stored; the outcome stays unknown", slog.String("scope", c.Scope), slog.Any("error", bad.err))
		return true, status.Errorf(codes.Internal, "idemgate: %v; the outcome stays unknown", bad.err)
	case err != nil:
		e.opts.Logger.WarnContext(ctx, "idemgate: the reconciler failed; the outcome stays unknown", slog.String("scope", c.Scope), slog.Any("error", err))
		return true, OutcomeUnknown(c.Key)
	}
	resolve := &idemgatev1.ResolveRequest{Scope: c.Scope, Key: c.Key}
	switch res.kind {
	case resolvedOutcome:
		resolve.Resolution = &idemgatev1.ResolveRequest_Complete{Complete: res.outcome}
	case resolvedNotRun:
		resolve.Resolution = &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}}
	default:
		return true, OutcomeUnknown(c.Key)
	}
	if err := e.Resolve(ctx, c, resolve); err != nil {
		return true, err
	}
	return false, nil
}

// run executes the handler under the reservation and settles it as its
// verdict says.
func (e *Engine) run(ctx context.Context, c *Call, t Transport, begun Begun) (any, error) {
	a := e.Start(ctx, c, begun)
	if a.lease.lapsed() {
		if err := e.confirmLease(ctx, c, a); err != nil {
			return nil, err
		}
	}
	defer func() {
		if p := recover(); p != nil {
			a.Lost("the handler panicked", slog.Any("panic", p))
			panic(p)
		}
	}()
	started := time.Now()
	ran := t.Run(a.Context(), a)
	e.Stage(c, StageHandler, time.Since(started))
	switch ran.Verdict {
	case VerdictOutcome:
		// The service counts the retention from when it stores the outcome,
		// after this, so the record lives at least until expires once
		// stored. An attempt already fenced stores synchronously even
		// after the reply, so its caller is told instead of getting an
		// answer no duplicate will see.
		expires := time.Now().Add(c.Retention)
		if fenced := a.Finish(ran.Outcome, c.Policy.FinishAfterReply && !a.Fenced()); fenced {
			if a.unstored {
				return nil, e.AnswerUnstored()
			}
			return nil, e.AnswerFenced()
		}
		t.Committed(ctx, expires)
		return ran.Answer, ran.Err
	case VerdictUnknown:
		if c.Policy.OnLostOutcome == idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE {
			a.Release(false)
			return ran.Answer, ran.Err
		}
		a.Release(true)
		return nil, HandlerOutcomeUnknown(c.Key, ran.Code, ran.Message)
	case VerdictLost:
		a.Lost(ran.Why, ran.Attrs...)
		return ran.Answer, ran.Err
	case VerdictAbandoned:
		a.Abandon()
		return ran.Answer, ran.Err
	case VerdictNotRun:
		a.Release(false)
		return ran.Answer, ran.Err
	default:
		a.Lost("the front end gave no verdict on the handler's answer")
		return nil, status.Errorf(codes.Internal, "idemgate: no verdict on the handler's answer (%d)", ran.Verdict)
	}
}

// confirmLease renews the reservation of a Begin answered a whole lease or
// more after it was sent, before its handler runs: the Begin's deadline
// (the Dedupe timeout plus max_wait) may outlast the lease, and the gate
// cannot tell a reservation made early in a slow Begin, which may have run
// out and been taken over since, from one made at the end of a long wait.
// Refused, the caller gets the fenced answer; unanswered, the reservation
// is released and the caller gets the Dedupe service's failure. Either way
// nothing ran.
func (e *Engine) confirmLease(ctx context.Context, c *Call, a *Attempt) error {
	hctx, cancel := context.WithTimeout(ctx, e.opts.DedupeTimeout)
	defer cancel()
	sent := time.Now()
	_, err := e.dedupe.Heartbeat(hctx, &idemgatev1.HeartbeatRequest{Scope: c.Scope, Key: c.Key, AttemptToken: c.Token, Epoch: a.epoch,
		Lease: durationpb.New(c.Policy.Lease)})
	switch {
	case err == nil:
		a.lease.confirmed(sent)
		return nil
	case status.Code(err) == codes.FailedPrecondition:
		a.Abandon()
		e.opts.Logger.WarnContext(ctx, "idemgate: the Begin was answered after its lease ran out and the reservation had been taken over or settled meanwhile; the handler did not run",
			slog.String("scope", c.Scope), slog.Int64("epoch", a.epoch))
		return e.AnswerFenced()
	default:
		a.Release(false)
		return e.BeginError(ctx, err)
	}
}
