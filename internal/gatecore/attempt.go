package gatecore

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// Attempt is a reservation whose handler runs: its lease is renewed from
// Start until Finish or Release, with no gap in between.
type Attempt struct {
	e     *Engine
	c     *Call
	epoch int64
	// ctx is the caller's context, for logs and values; hctx the handler's.
	ctx, hctx context.Context
	cancel    func()
	lease     *leaseKeeper
	// unstored: Finish reported fenced because the outcome was not stored
	// within its bound, not because another attempt took the key.
	unstored bool
}

// Start begins running a reservation Begin made. The handler's context
// (Context) keeps ctx's values but not its cancellation or deadline: a
// caller that gave up after the side effect started must find its outcome
// stored when it retries, not a second run. It ends with
// idemgate.ErrExecutionTimeout after the policy's execution timeout, and
// with idemgate.ErrFenced when the attempt loses its reservation. It
// carries the call (idemgate.KeyFromContext and its siblings read it).
func (e *Engine) Start(ctx context.Context, c *Call, b Begun) *Attempt {
	hctx, cancelExecution := context.WithTimeoutCause(context.WithoutCancel(ctx), c.Policy.ExecutionTimeout, idemgate.ErrExecutionTimeout)
	hctx, fence := context.WithCancelCause(withCall(hctx, c, b.Epoch))
	a := &Attempt{e: e, c: c, epoch: b.Epoch, ctx: ctx, hctx: hctx,
		cancel: func() { fence(nil); cancelExecution() }}
	a.lease = e.keepLease(ctx, c, b.Epoch, c.Policy.Lease/3-b.BeginTook, time.Now().Add(-b.BeginTook), func() { fence(idemgate.ErrFenced) })
	return a
}

// Context is the handler's context.
func (a *Attempt) Context() context.Context { return a.hctx }

// Epoch is the reservation's epoch.
func (a *Attempt) Epoch() int64 { return a.epoch }

// Lost stops the renewals of an attempt whose outcome will never be stored
// (the handler panicked, its answer cannot be serialized): the record goes
// down its on_lost_outcome path when the lease runs out.
func (a *Attempt) Lost(why string, attrs ...slog.Attr) {
	a.lease.stop()
	a.cancel()
	a.e.Event(a.c, EventOutcomeLost)
	a.e.opts.Logger.LogAttrs(a.ctx, slog.LevelError, "idemgate: "+why+"; its outcome is lost, not released, so the key will not silently run again",
		append([]slog.Attr{slog.String("scope", a.c.Scope), slog.Int64("epoch", a.epoch)}, attrs...)...)
}

// Abandon stops the renewals without storing anything and without counting
// a lost outcome (the answer cannot be stored and the front end says why).
func (a *Attempt) Abandon() {
	a.lease.stop()
	a.cancel()
}

// Fenced reports whether the attempt lost its reservation while it ran.
func (a *Attempt) Fenced() bool { return errors.Is(context.Cause(a.hctx), idemgate.ErrFenced) }

// Finish stores the outcome of a handler that ran. An outcome over the size
// limit (the Engine's, or the Dedupe service's when it is lower) is replaced
// by a ResultTooLarge marker, so a duplicate never runs the side effect again
// for want of a stored outcome. It reports whether the store refused the
// outcome at once because the attempt had been fenced: its caller must then
// get AnswerFenced (AnswerUnstored when the outcome was not stored within
// a lease), not this attempt's answer.
//
// With afterReply it returns at once, reporting false, and stores the
// outcome in the background (FINISH_POLICY_AFTER_REPLY), the lease renewed
// until it is stored or given up; Close waits for it.
func (a *Attempt) Finish(outcome *anypb.Any, afterReply bool) (fenced bool) {
	defer a.cancel()
	e, c := a.e, a.c
	req := &idemgatev1.FinishRequest{Scope: c.Scope, Key: c.Key, AttemptToken: c.Token, Epoch: a.epoch, Outcome: e.boundedOutcome(a.ctx, c, outcome, e.opts.MaxOutcome)}
	// firstSent is when the first Finish went out. The record expires
	// retention after the service stored it, and any attempt whose answer
	// was lost may have stored it: so no earlier than this, by the service's
	// clock, and the retry that answers must not date it later. (Attempts
	// run one after another.)
	var firstSent time.Time
	// Answering before the outcome is stored is safe only while the lease
	// is confirmed: lapsed, another attempt may take the key over and store
	// another outcome, so the outcome is stored (or found refused) first.
	if afterReply && a.lease.lapsed() {
		afterReply = false
	}
	if !afterReply {
		defer func(start time.Time) { e.Stage(c, StageFinish, time.Since(start)) }(time.Now())
	}
	fenced, a.unstored = e.settle(a.ctx, c, a.epoch, a.lease, settlement{
		rpc: "Finish",
		call: func(ctx context.Context) error {
			if firstSent.IsZero() {
				firstSent = time.Now()
			}
			res, err := e.dedupe.Finish(withOutcomeBytes(c.withAgent(ctx), req), req)
			if grpcerr.Reason(err) == reasonDedupeOutcomeTooLarge && req.GetOutcome().MessageName() != TooLargeName {
				req.Outcome = e.boundedOutcome(ctx, c, outcome, 0)
				res, err = e.dedupe.Finish(withOutcomeBytes(c.withAgent(ctx), req), req)
			}
			// An outcome the service replaced by the marker is not what
			// duplicates get: nothing here may keep it. Its log says why (the
			// gate's own size marker, replaced by itself, was logged already).
			if err == nil && res.GetOutcomeReplaced() {
				if req.GetOutcome().MessageName() != TooLargeName {
					e.opts.Logger.WarnContext(ctx, "idemgate: the Dedupe service stored a ResultTooLarge marker in place of the outcome: within the size limit, it would have taken this server over its stored-outcome quota (-caller-max-bytes); the caller got it, duplicates will get IDEMPOTENCY_RESULT_TOO_LARGE",
						slog.String("scope", c.Scope), slog.Int("bytes", proto.Size(req.GetOutcome())))
				}
			} else if err == nil && c.Stored != nil {
				c.Stored(req.GetOutcome(), firstSent)
			}
			return err
		},
		retryEvent: EventFinishRetry,
		failEvent:  EventOutcomeLost,
		lost:       "the side effect ran and the caller got its response, but the outcome could not be stored",
		answers:    true,
	}, afterReply)
	return fenced
}

// Release gives the reservation up after a handler error, so a retry runs;
// with unknown set it marks the record outcome-unknown instead, because the
// handler cannot tell whether its side effect happened.
func (a *Attempt) Release(unknown bool) {
	defer a.cancel()
	a.e.release(a.ctx, a.c, a.epoch, unknown, a.lease)
}

// boundedOutcome returns outcome, or the ResultTooLarge marker that takes its
// place when it is over limit.
func (e *Engine) boundedOutcome(ctx context.Context, c *Call, outcome *anypb.Any, limit int) *anypb.Any {
	size := proto.Size(outcome)
	if size <= limit {
		return outcome
	}
	e.Event(c, EventResultTooLarge)
	e.opts.Logger.WarnContext(ctx, "idemgate: the outcome is over the size limit (the Gate's, or the Dedupe service's when it is lower); the caller got it, duplicates will get IDEMPOTENCY_RESULT_TOO_LARGE",
		slog.String("scope", c.Scope), slog.Int("bytes", size), slog.Int("gate_limit", e.opts.MaxOutcome))
	marker, err := MarshalAny(&idemgatev1.ResultTooLarge{SizeBytes: int64(size), TypeUrl: e.opts.TypeURLOf(outcome),
		Cause: idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_SIZE_LIMIT})
	if err != nil {
		return outcome // cannot happen for this message; the service will refuse the big one
	}
	return marker
}

// leaseKeeper renews one reservation until stop is called.
type leaseKeeper struct {
	cancel context.CancelFunc
	done   chan struct{}
	// settling is set once the outcome is on its way: a renewal refused from
	// then on is the settlement racing it, and the settlement's own answer
	// says whether the attempt was fenced.
	settling atomic.Bool
	// lease is the reservation's lease; renewedAt is when the lease last
	// started by the service's grant (no later than the Begin or the renewal
	// it answered was sent), as the time since heldSince. Offsets from one
	// time.Time keep the monotonic clock: a wall-clock step cannot hide a
	// lapse or fake one.
	lease     time.Duration
	heldSince time.Time
	renewedAt atomic.Int64
}

// lapsed reports whether the lease has run out since the service last
// confirmed it: another attempt may have taken the key over without this
// one hearing so.
func (k *leaseKeeper) lapsed() bool {
	return time.Since(k.heldSince)-time.Duration(k.renewedAt.Load()) >= k.lease
}

// confirmed records a renewal the service granted, sent at sent.
func (k *leaseKeeper) confirmed(sent time.Time) {
	t := int64(sent.Sub(k.heldSince))
	for old := k.renewedAt.Load(); t > old && !k.renewedAt.CompareAndSwap(old, t); old = k.renewedAt.Load() {
	}
}

// stop ends the renewals and waits for them; it may be called more than once.
func (k *leaseKeeper) stop() {
	k.cancel()
	<-k.done
}

// maxOutstandingRenewals bounds the renewals in flight at once: a renewal
// that hangs must not stop the next one from being sent, and a dead store
// must not collect an unbounded number of them.
const maxOutstandingRenewals = 4

// keepLease renews the reservation about every third of the lease, the
// first time after first (at once when that is not positive), until
// stopped. When a renewal fails, or hangs past the next tick, another one is
// sent every tenth of the lease without waiting for it, so neither a flaky
// store nor a hung connection costs a live holder its reservation while
// some renewal can still get through. A renewal the service refuses means
// the attempt was fenced: fenced is called and the renewals stop.
func (e *Engine) keepLease(ctx context.Context, c *Call, epoch int64, first time.Duration, heldSince time.Time, fenced func()) *leaseKeeper {
	lease := c.Policy.Lease
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k := &leaseKeeper{cancel: cancel, done: make(chan struct{}), lease: lease, heldSince: heldSince}
	req := &idemgatev1.HeartbeatRequest{Scope: c.Scope, Key: c.Key, AttemptToken: c.Token, Epoch: epoch, Lease: durationpb.New(lease)}
	go func() {
		defer close(k.done)
		var attempts sync.WaitGroup
		defer attempts.Wait()
		type renewal struct {
			err  error
			sent time.Time
		}
		results := make(chan renewal, maxOutstandingRenewals)
		outstanding := 0
		timer := time.NewTimer(max(first, 0))
		defer timer.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-timer.C:
				if outstanding < maxOutstandingRenewals {
					outstanding++
					attempts.Add(1)
					go func() {
						defer attempts.Done()
						callCtx, cancelCall := context.WithTimeout(kctx, lease/2)
						defer cancelCall()
						sent := time.Now()
						_, err := e.dedupe.Heartbeat(callCtx, req)
						results <- renewal{err, sent}
					}()
				}
				// Until a renewal gets through, keep sending one a tick.
				timer.Reset(lease / 10)
			case r := <-results:
				outstanding--
				err := r.err
				switch {
				case err == nil:
					// The lease runs from no later than the renewal was sent.
					k.confirmed(r.sent)
					timer.Reset(lease / 3)
				case kctx.Err() != nil:
					return
				case status.Code(err) == codes.FailedPrecondition && k.settling.Load():
					return
				case status.Code(err) == codes.FailedPrecondition:
					e.Event(c, EventFenced)
					e.opts.Logger.WarnContext(ctx, "idemgate: the reservation was taken over or settled by another attempt (its lease ran out, or an operator resolved it); "+
						"the handler's context is cancelled with ErrFenced and this attempt's outcome will be refused",
						slog.String("scope", c.Scope), slog.Int64("epoch", epoch))
					fenced()
					return
				default:
					e.Event(c, EventHeartbeatFailure)
					e.opts.Logger.WarnContext(ctx, "idemgate: could not renew the reservation's lease; trying again soon", slog.String("scope", c.Scope), slog.Int64("epoch", epoch), slog.Any("error", err))
				}
			}
		}
	}()
	return k
}

// release gives the reservation up, or marks it outcome-unknown, retried
// within the finish retry budget.
func (e *Engine) release(ctx context.Context, c *Call, epoch int64, unknown bool, lease *leaseKeeper) {
	e.releaseBy(ctx, c, epoch, unknown, lease, time.Time{})
}

// releaseBy is release retried until deadline (when not zero) instead: a
// lost Begin's follow-up releases within its own budget.
func (e *Engine) releaseBy(ctx context.Context, c *Call, epoch int64, unknown bool, lease *leaseKeeper, deadline time.Time) {
	req := &idemgatev1.ReleaseRequest{Scope: c.Scope, Key: c.Key, AttemptToken: c.Token, Epoch: epoch, OutcomeUnknown: unknown}
	lost := "the handler failed, but its reservation could not be released"
	if unknown {
		lost = "the handler's outcome is unknown, but the record could not be marked so"
		// A renewal that lands after the mark would turn the record back
		// into a live reservation: no renewal may be under way when it goes.
		lease.stop()
	}
	_, _ = e.settle(ctx, c, epoch, lease, settlement{
		rpc: "Release",
		call: func(ctx context.Context) error {
			_, err := e.dedupe.Release(ctx, req)
			return err
		},
		retryEvent: EventReleaseRetry,
		failEvent:  EventReleaseFailure,
		lost:       lost,
		deadline:   deadline,
	}, false)
}

// settlement is one way to end a reservation: Finish or Release.
type settlement struct {
	// rpc names the Dedupe RPC, for logs.
	rpc string
	// call makes one attempt.
	call func(context.Context) error
	// retryEvent is counted for each attempt after the first; failEvent when
	// the settlement is given up or rejected.
	retryEvent, failEvent string
	// lost says what a settlement given up leaves behind.
	lost string
	// deadline, when not zero, ends the retries instead of the finish
	// retry budget.
	deadline time.Time
	// answers: the caller is answered with what this settlement stores
	// (Finish, not Release), so with a lease lapsed unconfirmed it must be
	// stored before the answer.
	answers bool
}

// settle ends the reservation and then stops renewing its lease. The first
// attempt runs before the caller gets its answer, so a duplicate right after
// it sees the result, and detached from the caller's context: a caller that
// timed out after the side effect ran must still leave its outcome behind.
// If the Dedupe service cannot take it, retries with backoff go on in the
// background within the finish retry budget (Close waits for them), and the
// lease is renewed all along. Once Close has begun they are made here
// instead, before the caller's answer, until Close's context ends.
//
// A Finish that answers the caller (answers) is stored before the answer:
// a holder cut off after answering may lose its key to another attempt
// (REEXECUTE) that stores another outcome, and the caller's answer would
// name an execution the key never replays. So the retries are made before
// the answer, the lease renewed meanwhile, for up to a lease (less when the
// finish retry budget ends or the caller gives up first), and an attempt
// whose outcome is still not stored answers as fenced, so its caller's
// retry gets whatever the key keeps; the retries then go on in the
// background within the budget. The service grants a holder a full lease
// once it is back from an outage, so a store outage alone still costs the
// holder nothing once the store is back within that lease.
//
// It reports whether the caller must get the fenced answer: an attempt made
// before the answer was refused because the attempt had been fenced, or the
// outcome was not stored within the bound or was rejected for good (then
// unstored, too).
//
// With inBackground even the first attempt runs in the background: settle
// returns at once, reporting false, and the lease is renewed until the
// matter is settled or given up, as for the retries (once Close has begun,
// all of them are made before the answer).
func (e *Engine) settle(ctx context.Context, c *Call, epoch int64, lease *leaseKeeper, s settlement, inBackground bool) (fenced, unstored bool) {
	lease.settling.Store(true)
	detached := context.WithoutCancel(ctx)
	budget := s.deadline
	if budget.IsZero() {
		budget = time.Now().Add(e.opts.FinishBudget)
	}
	// answerFenced: the caller must not get its own answer. Refused as
	// fenced; or, with a lease lapsed unconfirmed, nothing stored (a
	// rejection stores nothing either): another attempt's outcome may be
	// what the key keeps.
	answerFenced := func(r settled) bool {
		return r == settledFenced || s.answers && r != settledStored && lease.lapsed()
	}
	unsettled := false
	if !inBackground {
		r := e.trySettle(detached, c, epoch, s)
		if r == notSettled && s.answers {
			// The caller is answered only with an outcome the store took:
			// retried here, the lease renewed meanwhile, for up to a lease
			// (within the budget and the caller's own deadline).
			bound := time.Now().Add(c.Policy.Lease)
			if budget.Before(bound) {
				bound = budget
			}
			r = e.retrySettle(ctx, c, epoch, s, bound, false)
			if r == notSettled {
				unsettled = true
				e.opts.Logger.WarnContext(ctx, "idemgate: the outcome could not be stored within a lease; the caller is told to retry with its key rather than given an answer the key may never keep (retries go on in the background)",
					slog.String("scope", c.Scope), slog.Int64("epoch", epoch))
			}
		}
		if r != notSettled {
			defer lease.stop()
			if s.answers && r == settledRejected {
				return true, true // nothing stored: the caller is not answered with it either
			}
			return answerFenced(r), false
		}
	}
	if !e.startBackground() {
		// Close has begun (a handler can outlive a server's Stop): nothing
		// new joins the background, so the settlement is retried here,
		// before the answer, as it would have been there.
		defer lease.stop()
		r := e.retrySettle(detached, c, epoch, s, budget, inBackground)
		if r == notSettled {
			e.giveUp(ctx, c, epoch, s)
		}
		if r == settledStored {
			return false, false
		}
		rejected := s.answers && r == settledRejected
		return unsettled || rejected || answerFenced(r), (unsettled || rejected) && r != settledFenced
	}
	go func() {
		defer e.background.Done()
		defer lease.stop()
		if e.retrySettle(detached, c, epoch, s, budget, inBackground) == notSettled {
			e.giveUp(ctx, c, epoch, s)
		}
	}()
	return unsettled, unsettled
}

// settled is how a settlement's attempts ended.
type settled int

const (
	// notSettled: no answer yet, or one that a retry may change.
	notSettled settled = iota
	// settledStored: the service took it.
	settledStored
	// settledFenced: refused, because another attempt or an operator
	// holds or settled the key.
	settledFenced
	// settledRejected: refused for good for another reason (a
	// misconfiguration); nothing was stored.
	settledRejected
)

// retrySettle makes the settlement's attempts with backoff (with first, the
// first of them at once) until it is settled, deadline passes, ctx or
// Close's context (backgroundCtx) ends. It reports how it ended.
func (e *Engine) retrySettle(ctx context.Context, c *Call, epoch int64, s settlement, deadline time.Time, first bool) settled {
	bctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	defer context.AfterFunc(e.backgroundCtx, cancel)()
	if first {
		if r := e.trySettle(bctx, c, epoch, s); r != notSettled {
			return r
		}
	}
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		if !time.Now().Add(backoff).Before(deadline) || !sleep(bctx, backoff) {
			return notSettled
		}
		e.Event(c, s.retryEvent)
		if r := e.trySettle(bctx, c, epoch, s); r != notSettled {
			return r
		}
	}
}

// giveUp counts and logs a settlement that will not be retried any more:
// its budget ran out or the Gate was closed.
func (e *Engine) giveUp(ctx context.Context, c *Call, epoch int64, s settlement) {
	why := "the retry budget ran out"
	if e.backgroundCtx.Err() != nil {
		why = "the Gate was closed"
	}
	e.Event(c, s.failEvent)
	e.opts.Logger.ErrorContext(ctx, "idemgate: gave up ("+why+"): "+s.lost+"; the key goes down its on_lost_outcome path when the lease runs out",
		slog.String("rpc", s.rpc), slog.String("scope", c.Scope), slog.Int64("epoch", epoch), slog.Duration("budget", e.opts.FinishBudget))
}

// sleep waits for d and reports true, or false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// trySettle makes one attempt and reports how it ended: stored, refused
// for good (fenced, or rejected), or not settled (retry).
func (e *Engine) trySettle(ctx context.Context, c *Call, epoch int64, s settlement) settled {
	callCtx, cancel := context.WithTimeout(ctx, e.opts.OutcomeTimeout)
	defer cancel()
	err := s.call(callCtx)
	switch status.Code(err) {
	case codes.OK:
		return settledStored
	case codes.FailedPrecondition:
		e.Event(c, EventFenced)
		e.opts.Logger.WarnContext(ctx, "idemgate: refused because the reservation had been taken over or settled by another attempt (its lease ran out, or an operator resolved it); what the other attempt did stands",
			slog.String("rpc", s.rpc), slog.String("scope", c.Scope), slog.Int64("epoch", epoch))
		return settledFenced
	case codes.ResourceExhausted:
		if _, ok := grpcerr.RetryDelay(err); ok {
			// Over the caller's rate at the Dedupe service (a Finish's
			// outcome bytes, say): it passes once tokens are free, so it is
			// retried like an outage, within the budget.
			e.opts.Logger.WarnContext(ctx, "idemgate: the Dedupe service is rate limiting this tool server; retrying",
				slog.String("rpc", s.rpc), slog.String("scope", c.Scope), slog.Any("error", err))
			return notSettled
		}
		e.Event(c, s.failEvent)
		e.opts.Logger.ErrorContext(ctx, "idemgate: the Dedupe service rejected this: "+s.lost,
			slog.String("rpc", s.rpc), slog.String("scope", c.Scope), slog.Any("error", err))
		return settledRejected
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
		e.Event(c, s.failEvent)
		e.opts.Logger.ErrorContext(ctx, "idemgate: the Dedupe service rejected this: "+s.lost,
			slog.String("rpc", s.rpc), slog.String("scope", c.Scope), slog.Any("error", err))
		return settledRejected
	default:
		e.opts.Logger.WarnContext(ctx, "idemgate: the Dedupe service could not take this; retrying",
			slog.String("rpc", s.rpc), slog.String("scope", c.Scope), slog.Any("error", err))
		return notSettled
	}
}

// withOutcomeBytes is ctx declaring the size of req's outcome to the Dedupe
// service (keys.OutcomeBytesHeader), which then charges its caller's
// outcome-byte budget from the headers and may refuse the Finish before
// reading its message.
func withOutcomeBytes(ctx context.Context, req *idemgatev1.FinishRequest) context.Context {
	o := req.GetOutcome()
	return metadata.AppendToOutgoingContext(ctx, keys.OutcomeBytesHeader, strconv.Itoa(len(o.GetTypeUrl())+len(o.GetValue())))
}
